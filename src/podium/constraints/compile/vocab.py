"""What compiling a constraint needs to know about the engine's tokenizer."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from functools import cached_property
from json.encoder import encode_basestring
from typing import Any

import numpy as np

MEMO_SIZE = 200_000
"""Texts whose verified tokenization :meth:`TokenizerInfo.encode_exact` remembers, besides a
catalog's (:meth:`TokenizerInfo.remember`), which are always kept."""
REMEMBER_CHUNK = 4096
"""Strings a catalog is tokenized in at a time (one batch call, one verifying decode)."""


class TokenizerInfo:
    """A tokenizer seen by the constraint compiler: encoding, EOS ids and the logits width."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int | None = None,
        eos_token_ids: tuple[int, ...] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        # the model's logits may be wider than the tokenizer (padded embedding rows)
        self.vocab_size = max(vocab_size or 0, len(tokenizer))
        ids = set(eos_token_ids or ())
        if tokenizer.eos_token_id is not None:
            ids.add(int(tokenizer.eos_token_id))
        if not ids:
            raise ValueError("the tokenizer has no end-of-sequence token; constraints need one")
        self.eos_token_ids = tuple(sorted(ids))
        self._memo: dict[str, bytes] = {}  # text -> verified canonical tokens (int32)
        self._quoted_memo: dict[str, bytes] = {}  # text -> tokens of its JSON string literal
        self._pinned = {False: 0, True: 0}  # a catalog's entries, first in each memo: kept
        # held to change a memo (add, trim, pin); never to read it, nor while tokenizing
        self._writing = threading.Lock()
        self._counts = threading.local()

    @classmethod
    def from_pretrained(cls, path: str, vocab_size: int | None = None) -> TokenizerInfo:
        """Load a local HF tokenizer folder (never a hub download)."""
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(path, local_files_only=True), vocab_size)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Canonical token ids of each text, without special tokens."""
        if not texts:
            return []
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            # the Rust tokenizer directly: the transformers wrapper doubles the cost
            return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]

    def encode_exact(self, texts: list[str]) -> list[list[int]]:
        """Like :meth:`encode_batch`, but raise ``ValueError`` for a text the tokenizer cannot
        reproduce (some drop control characters): its output could never equal the text."""
        return [np.frombuffer(b, dtype=np.int32).tolist() for b in self._packed(texts)]

    def encode_runs(self, texts: list[str], *, quoted: bool = False) -> TokenRuns:
        """:meth:`encode_exact` packed end to end in one array (what a trie is built from).

        Texts seen before come from a memo: per-request candidate sets are mostly drawn from
        one catalog, so most of a new spec's strings were tokenized for an earlier one. The
        memo keeps each text's tokens as packed bytes, so a spec of 500 remembered strings
        becomes one array by one join, not 500 list conversions. `quoted`: each text as a JSON
        string literal (`json.dumps(text, ensure_ascii=False)`), remembered by the text itself,
        whose hash the caller has usually computed already."""
        parts = self._packed(texts, quoted, count=True)
        lengths = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts)) // 4
        return TokenRuns.joined(np.frombuffer(b"".join(parts), dtype=np.int32), lengths)

    def remember(self, texts: list[str]) -> int:
        """Tokenize a catalog ahead of requests, in both spellings constraints use (the text,
        for ``choice``; its JSON string literal, for ``distinct_items``), and keep it through
        the memo's trims. Texts the tokenizer cannot reproduce are left out (a request naming
        one gets its 400 then); the number left out is returned."""
        skipped = 0
        for quoted in (False, True):
            memo = self._quoted_memo if quoted else self._memo
            new = [t for t in dict.fromkeys(texts) if t not in memo]
            tokens: dict[str, bytes] = {}
            for at in range(0, len(new), REMEMBER_CHUNK):
                chunk = new[at:at + REMEMBER_CHUNK]
                spelled = list(map(encode_basestring, chunk)) if quoted else chunk
                for text, ids, _ in self._encode_verified(spelled, chunk):
                    if ids is None:
                        skipped += 1
                    else:
                        tokens[text] = np.asarray(ids, dtype=np.int32).tobytes()
            with self._writing:  # requests' entries move behind the catalog's, which stay
                requests = dict(itertools.islice(memo.items(), self._pinned[quoted], None))
                for text in requests:
                    del memo[text]
                for text in dict.fromkeys(texts):
                    if text in requests:
                        memo[text] = requests.pop(text)
                memo.update(tokens)
                self._pinned[quoted] = len(memo)
                memo.update(requests)
        return skipped

    def tokenized_here(self) -> int:
        """Candidate texts (:meth:`encode_runs`) this thread tokenized since it last asked:
        the memo's misses, what a compile paid the tokenizer for."""
        count = getattr(self._counts, "n", 0)
        self._counts.n = 0
        return count

    def _packed(self, texts: list[str], quoted: bool = False, count: bool = False,
                ) -> list[bytes]:
        memo = self._quoted_memo if quoted else self._memo
        parts = list(map(memo.get, texts))
        if None in parts:
            missing = list(dict.fromkeys(t for t, b in zip(texts, parts, strict=True)
                                         if b is None))
            if count:
                self._counts.n = getattr(self._counts, "n", 0) + len(missing)
            spelled = list(map(encode_basestring, missing)) if quoted else missing
            fresh = dict(zip(missing, (np.asarray(ids, dtype=np.int32).tobytes()
                                       for ids in self._encode_checked(spelled)), strict=True))
            with self._writing:
                pinned = self._pinned[quoted]
                if len(memo) + len(fresh) > pinned + MEMO_SIZE:
                    # a crude bound on requests' entries; a catalog's, first in the memo, stay
                    kept = dict(itertools.islice(memo.items(), pinned))
                    memo.clear()
                    memo.update(kept)
                memo.update(fresh)
            # from `fresh`, not the memo: another thread's trim may have emptied it since
            parts = [fresh[t] if b is None else b for t, b in zip(texts, parts, strict=True)]
        return parts  # type: ignore[return-value]

    def _encode_checked(self, texts: list[str]) -> list[list[int]]:
        encoded = []
        for text, ids, back in self._encode_verified(texts, texts):
            if ids is None:
                raise ValueError(f"the tokenizer cannot produce {text!r} (it reads back as "
                                 f"{back!r}); remove the characters it drops")
            encoded.append(ids)
        return encoded

    def _encode_verified(self, texts: list[str], names: list[str],
                         ) -> list[tuple[str, list[int] | None, str]]:
        """(name, token ids or None where decoding them does not give the text back, the
        text read back) for each text."""
        encoded = self.encode_batch(texts)
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            decoded = backend.decode_batch(encoded, skip_special_tokens=False)
        else:
            decoded = self.tokenizer.batch_decode(encoded, skip_special_tokens=False,
                                                  clean_up_tokenization_spaces=False)
        return [(name, ids if text == back else None, back)
                for name, text, ids, back in zip(names, texts, encoded, decoded, strict=True)]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)

    @cached_property
    def token_chars(self) -> TokenChars:
        """Every non-special token's text as code points, for character-level automata.

        Tokens that are not whole UTF-8 characters (a fragment of a multi-byte character) are
        left out: a character-level automaton cannot step on half a character.
        """
        ids: list[int] = []
        texts: list[str] = []
        for raw, same in self._token_bytes().items():
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                continue
            for i in same:
                if i not in self.eos_token_ids:
                    ids.append(i)
                    texts.append(text)
        lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        codes = np.full((len(texts), int(lengths.max(initial=1))), -1, dtype=np.int32)
        for row, text in enumerate(texts):
            codes[row, : len(text)] = np.frombuffer(text.encode("utf-32-le"), dtype=np.int32)
        # a set of the distinct characters is far cheaper than np.unique over the matrix
        uniq = np.array(sorted({-1, *(ord(c) for t in texts for c in t)}), dtype=np.int32)
        index = np.searchsorted(uniq, codes).astype(np.int32)
        return TokenChars(np.asarray(ids, dtype=np.int64), codes, lengths, uniq, index)

    def _token_bytes(self) -> dict[bytes, list[int]]:
        """Each non-special token's bytes -> the ids spelling them."""
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        special = set(self.tokenizer.all_special_ids)
        byte_of = {ch: b for b, ch in bytes_to_unicode().items()}
        pieces = self.tokenizer.convert_ids_to_tokens(list(range(len(self.tokenizer))))
        out: dict[bytes, list[int]] = {}
        for i, piece in enumerate(pieces):
            if i in special or piece is None:
                continue
            try:
                raw = bytes(byte_of[ch] for ch in piece)
            except KeyError:
                # not byte-level BPE: let vLLM's mapping (SentencePiece etc.) do it
                from vllm.v1.structured_output.utils import _reduced_vocabulary

                return _reduced_vocabulary(self.tokenizer)
            out.setdefault(raw, []).append(i)
        return out


@dataclass(frozen=True)
class TokenRuns:
    """Token sequences end to end: sequence i is ``flat[offsets[i]:offsets[i + 1]]``."""

    flat: np.ndarray
    """int64 [total tokens]."""
    offsets: np.ndarray
    """int64 [num sequences + 1]."""

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @classmethod
    def joined(cls, flat: np.ndarray, lengths: np.ndarray) -> TokenRuns:
        """Sequences of these `lengths` laid end to end in `flat`."""
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(flat.astype(np.int64, copy=False), offsets)

    @classmethod
    def of(cls, sequences: list[list[int]]) -> TokenRuns:
        """Pack plain lists (callers without the memo)."""
        lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
        flat = np.fromiter((t for seq in sequences for t in seq), dtype=np.int64,
                           count=int(lengths.sum()))
        return cls.joined(flat, lengths)


@dataclass(frozen=True)
class TokenChars:
    """Token texts as a padded code-point matrix (-1 past each token's end)."""

    ids: np.ndarray
    """int64 [num_tokens]: token id of each row."""
    codes: np.ndarray
    """int32 [num_tokens, max_len]: code points."""
    lengths: np.ndarray
    """int64 [num_tokens]: characters per token."""
    unique_codes: np.ndarray
    """int32: the distinct values of ``codes``, sorted."""
    code_index: np.ndarray
    """int32 [num_tokens, max_len]: index of each code point in ``unique_codes``."""
