"""Inside vLLM's engine: the batch-level logits processor, the batch's per-slot state and the
mask. Adopts compiled forms from the host's store; compiles nothing in the step (but for a
request that came without its form, counted and logged).
"""
