"""From a normalized spec to a compiled form, off the engine step.

The state machines (token tables, the ``choice`` trie, ``distinct_items``, ``regex``'s DFA
lifted to tokens), the tokenizer's view (``vocab``), the compiled form and its host-wide store,
and the three ways a server compiles: in a thread (``compiler``, ``precompile``), in a worker
process of its own (``process``: the server's side; ``worker``: the process).
"""
