"""What a constraint is, before any tokenizer: the types by name (built-ins and plugins), each
type's spec validation, and the admission of a request's ``constraint`` field.

Imports nothing heavy (no numpy kernels, no tokenizer): it runs in the server's request path.
"""
