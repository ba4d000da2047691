"""The untrusted-input boundary: every byte a visitor uploads passes through here first.

Threat model: a remote visitor of the dashboard (or the author of a file a batch user is sent)
controls the bytes of a model and a data file, and nothing else. Without `trust_code` no file
may run code, and no small file may take the machine (memory, time, cores) or end the server.

Each module guards against one kind of harm (its docstring details it):
- `limits`: every budget in one place (`Limits`, `MAX_UPLOAD_BYTES`): file size, decoded
  bytes, features, layers, parameters, pickle size and nodes, archive entries, row groups,
  and the first run's time and memory; `over_budget` words every refusal alike.
- `files`: the bytes themselves: a file over the size limit (`read_source`), a format
  claimed by a file name (`sniff` reads the content), zip bombs and crafted archives
  (`zip_entry_names`: the directory's entries counted and named by a bounded parse of
  the directory itself, never from the count the file states, names that are not text or
  that denote one path twice refused; `open_zip`: then the declared sizes, then each
  entry inflated once and refused as soon as it lies about its size or CRC).
- `pickles`: code execution by unpickling (`unpickle`, the one `torch.load` of the
  package: weights only, one policy text, unless the caller's own `trust_code`); slow
  pickles (`check_pickle_size`); pickle laughs and self-containing lists (`pickled_size`).
- `tensors`: tensors that are not dense real CPU numbers (`check_tensor`), and state dicts
  that expand when converted to float32 (`checked_state`); safetensors read through both.
- `export_guard`: a `.pt2` (torch.export archive) is checked deny-by-default before
  `torch.export.load` reads it: known operators only, no custom classes or code.
- `jail`: the boundary itself. Untrusted files are read, tokenized and first run only in a
  child process (under bubblewrap where available, and kernel limits on memory, CPU, time
  and written bytes), which hands back plain JSON facts and `.npy` arrays, never a pickle;
  the jail runs the task its caller names and imports no loader.

Modules here import only `attribution.errors` and each other. The loaders in
`attribution.inputs` read files only through these checks.
"""
