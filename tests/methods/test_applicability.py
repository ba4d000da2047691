"""One rule says which methods apply to which inputs, layers and models: `methods_for` lists
exactly the methods that `neuron_scores` runs, on every model family, and an attention mask
stored as floats does not make token ids scalable (conductance and DeepLift are refused, as
`methods_for` leaves them out)."""
import pytest
import torch

import attribution as at
from attribution.analyses import settings
from attribution.engine import model_io
from attribution.methods.registry import REGISTRY
from tests.support.families import FAMILIES, family

RULED = tuple(name for name, entry in REGISTRY.items()
              if entry.needs_float_inputs or entry.layer_kinds or entry.module_kinds)


@pytest.mark.parametrize("name", FAMILIES)
def test_methods_for_lists_exactly_the_methods_that_run(name):
    model, x = family(name)
    layers = at.list_layers(model, model_io.take(model_io.named(x), slice(0, 2)))
    layer = settings.default_layer(layers)
    kind = next(info.kind for info in layers if info.name == layer)
    listed = set(at.methods_for(model_io.named(x).dtype, kind, model)) & set(RULED)
    ran = set()
    for method in RULED:
        try:
            at.neuron_scores(model, layer, x, None, method, n_steps=4)
        except at.AttributionError:
            continue
        ran.add(method)
    assert listed == ran


def test_a_float_attention_mask_does_not_make_token_ids_scalable():
    model, x = family("bart")
    assert x["attention_mask"].is_floating_point()
    assert not model_io.is_floating(x) and model_io.named(x).dtype == torch.int64
    listed = at.methods_for(model_io.named(x).dtype)
    assert "conductance" not in listed and "deeplift" not in listed
    for method in ("conductance", "deeplift"):
        with pytest.raises(at.AttributionError, match="zero baseline of the inputs"):
            at.neuron_scores(model, "classification_head.dense", x, None, method)
