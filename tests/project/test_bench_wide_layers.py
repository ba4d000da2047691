"""benchmarks/bench_wide_layers.py runs for hours on GPT-2 and minutes on a ResNet stage, so
the suite runs its every row on a small MLP instead: a refactor of the analyses it calls
(the view's, which left it raising AttributeError) fails here, not in `make bench`."""
import torch
from torch import nn

from benchmarks import bench_wide_layers, common


def test_every_row_of_the_wide_layer_table_is_measured_on_a_small_model(monkeypatch, capsys):
    monkeypatch.setattr(common, "RECORDED", [])
    monkeypatch.setitem(bench_wide_layers.LAYERS, "small", "1")  # the ReLU
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 24), nn.ReLU(), nn.Linear(24, 12), nn.ReLU(),
                          nn.Linear(12, 3)).eval()
    x = torch.randn(48, 8)

    bench_wide_layers.measure("small", model, x, torch.arange(48) % 3, batch_size=16)

    (table,) = [entry for entry in common.RECORDED if "rows" in entry]
    labels = [row[0] for row in table["rows"]]
    for measured in ("gradient scores, all 24 neurons", "diagnose at its defaults",
                     "integrated gradients at", "Pruning page's curves at their defaults",
                     "scorecard of this layer", "  scorecard random: on 24 of 24 neurons"):
        assert any(label.startswith(measured) for label in labels), (measured, labels)
    ratios = [float(row[2].split()[-1]) for row in table["rows"]
              if row[2].startswith("said/took")]
    assert len(ratios) == 6 and all(ratio > 0 for ratio in ratios)
    assert "diagnose at its defaults" in capsys.readouterr().out
