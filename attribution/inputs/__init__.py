"""What a user brings: models (`model_formats`, the entry point, with `architectures` and
`huggingface`; `loaded` holds the `LoadedModel` they all return), data (`data`, `streaming`)
and the built-in demo (`demo`, its files in `shipped.DEMO_DIR`). Everything read from a file
passes through the untrusted-input boundary in `inputs.untrusted` first.
"""
