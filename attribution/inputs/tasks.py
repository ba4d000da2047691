"""What the jail's children run: one `jail.Task` per kind of untrusted file, its function
named, not imported. Torch-free, so a front end can start the jail (`jail.warm_up`) before it
imports torch itself: the two imports then run side by side."""
from __future__ import annotations

from .shipped import DEMO_DIR
from .untrusted import jail

FIRST_RUN = jail.Task("attribution.inputs.model_formats:_load_in_child",
                      warm_files=(str(DEMO_DIR / "digits_mlp.pt2"),))
"""A model file's load and first run (`model_formats.first_run`): `load_model` without a sandbox
of its own. The jail's server loads the demo's .pt2 first (torch.export's lazily imported
deserializer), so that no child spends its budget importing it."""
FIRST_RUN_OF_A_FOLDER = jail.Task(FIRST_RUN.function,
                                  warm_files=(str(DEMO_DIR / "text_classifier"),))
"""A Hugging Face folder's load and first run: the server loads the demo's folder first
(transformers' loaders, about 2.5 s of CPU to import, over half a first run's 5 s budget)."""


def first_run_task(of_a_folder: bool) -> jail.Task:
    """The task that loads and runs a model: a Hugging Face folder's (known by its path or
    its files' names), or a model file's (bytes, a folder's zip included: nothing of them is
    read before the jail accepts them)."""
    return FIRST_RUN_OF_A_FOLDER if of_a_folder else FIRST_RUN


READ_DATA = jail.Task("attribution.inputs.data_files:_read_in_jail")
"""An untrusted data file, read whole (`data_files.load_data`)."""
READ_LAYOUT = jail.Task("attribution.inputs.streaming:read_layout")
"""A .npy file's header, for streaming it (`streaming.NpyRows`)."""
READ_SMALL = jail.Task("attribution.inputs.streaming:_read_small")
"""A small .npy of per-sample values, read whole (`streaming.read_per_sample`)."""
