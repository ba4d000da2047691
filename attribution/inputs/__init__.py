"""What a user brings: models (`loading`, `architectures`, `huggingface`), data (`data`,
`streaming`) and the built-in demo (`demo`). Everything read from a file passes through the
untrusted-input boundary in `inputs.untrusted` first.
"""
