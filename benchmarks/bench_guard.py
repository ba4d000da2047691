"""The static rule's cost: a `.pt2` whose sizes follow its input shapes is what the first run
can bound, and `export_guard` checks it before torch reads the archive.

    python -m benchmarks.bench_guard [--results FILE]

Side by side in one run, medians of 7 interleaved: the whole archive check
(`check_export_archive`) of each demo `.pt2` and of a GPT-2-shaped export with the rule on
(as shipped) and off (its operator test replaced by a no-op), and, for scale, the first-run
load of the digits MLP through the jail (the step an upload waits on before its first chart).
"""
import io

import torch

import attribution as at
from attribution.inputs import model_formats
from attribution.inputs.shipped import DEMO_DIR
from attribution.inputs.untrusted import export_guard
from attribution.inputs.untrusted.export_guard import program  # noqa: F401 - patched below
from benchmarks.common import interleaved_medians, note, report, run


def _gpt2() -> bytes:
    """A GPT-2 sequence classifier (2 layers) exported as a .pt2: hundreds of nodes."""
    import transformers

    config = transformers.GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=2,
                                     n_positions=32, num_labels=3, pad_token_id=0,
                                     bos_token_id=1, eos_token_id=1)
    model = transformers.GPT2ForSequenceClassification(config).eval()
    return at.save_pt2(model, {"input_ids": torch.randint(1, 100, (2, 16))})


def main() -> None:
    archives = {"digits MLP": (DEMO_DIR / "digits_mlp.pt2").read_bytes(),
                "digits CNN": (DEMO_DIR / "digits_cnn.pt2").read_bytes(),
                "GPT-2, 2 layers": _gpt2()}
    rule = export_guard.program._shaped_by_inputs
    for name, data in archives.items():
        def checked(on: bool, data=data):
            export_guard.program._shaped_by_inputs = rule if on else (lambda *args: None)
            try:
                export_guard.check_export_archive(data)
            finally:
                export_guard.program._shaped_by_inputs = rule
        medians = interleaved_medians({"rule on (as shipped)": lambda: checked(True),
                                       "rule off": lambda: checked(False)}, repeats=7)
        report(f"archive check of the {name} .pt2", medians, "rule off")

    def first_upload():
        model_formats._ACCEPTED.clear()
        at.load_model(io.BytesIO(archives["digits MLP"]).getvalue())
    upload = interleaved_medians({"upload": first_upload}, repeats=5)["upload"]
    text = (f"For scale: a first upload of the digits MLP (the jail's first run included) "
            f"takes {upload * 1000:.0f} ms (median of 5).")
    print(f"\n{text}")
    note(text)


if __name__ == "__main__":
    raise SystemExit(run(main, "bench_guard"))
