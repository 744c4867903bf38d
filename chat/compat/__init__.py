"""Library internals the project relies on, one module per library, each naming the versions it was written against.

Nothing here imports another project module: it sits at the bottom of the layers, beside
chat.models. Each module has tests (tests/compat/) that fail when the library's
behaviour it relies on changes; re-read the library then, and update the module.
"""
