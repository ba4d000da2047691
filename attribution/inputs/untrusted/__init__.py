"""The untrusted-input boundary: every byte a visitor uploads passes through here first.

Threat model: a remote visitor of the dashboard (or the author of a file a batch user is sent)
controls the bytes of a model and a data file, and nothing else. Without `trust_code` no file
may run code, and no small file may take the machine (memory, time, cores) or end the server.

- `limits`: every budget in one place (`Limits`): decoded bytes, features, layers,
  parameters, pickle size and nodes, archive entries, row groups, and the first run's time
  and memory.
- `export_guard`: a `.pt2` (torch.export archive) is checked deny-by-default before
  `torch.export.load` reads it: known operators only, no custom classes or code.
- `watchdog`: an uploaded model's first load and run happen in a child process with a time
  and memory budget.

The loaders in `attribution.inputs` read files only through these checks.
"""
