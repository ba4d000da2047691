"""Cluster sources (`analyses.clusters`): the data's own ids, true and predicted classes,
correct vs. misclassified, k-means on the inputs and on a layer's activations, in memory
and streamed."""
import numpy as np
import pytest
import torch
from torch import nn

import attribution as at
from attribution.analyses.clusters import layer_activations
from tests.support.models import INPUTS, LABELS, picker_model


def test_label_prediction_and_correctness_clusters():
    dataset = at.Dataset(inputs=INPUTS, labels=LABELS, clusters=["p", "q", "p", "q"])
    model = picker_model()
    assert at.make_clusters("provided", dataset).tolist() == ["p", "q", "p", "q"]
    assert at.make_clusters("label", dataset).tolist() == [0, 1, 1, 0]
    assert at.make_clusters("predicted", dataset, model).tolist() == [1, 1, 1, 1]
    assert at.predict_classes(model, dataset.inputs, batch_size=3).tolist() == [1, 1, 1, 1]
    assert at.make_clusters("correctness", dataset, model.module).tolist() == [
        "misclassified", "correct", "correct", "misclassified"]


def test_cluster_sources_explain_what_they_need():
    unlabeled = at.Dataset(inputs=INPUTS)
    with pytest.raises(at.AttributionError, match="no cluster ids"):
        at.make_clusters("provided", unlabeled)
    with pytest.raises(at.AttributionError, match="needs labels"):
        at.make_clusters("correctness", unlabeled, picker_model())
    with pytest.raises(at.AttributionError, match="needs the model"):
        at.make_clusters("predicted", unlabeled)
    with pytest.raises(at.AttributionError, match="needs a layer"):
        at.make_clusters("kmeans_activations", unlabeled, picker_model(), k=2)
    with pytest.raises(at.AttributionError, match="Unknown cluster source 'labels'"):
        at.make_clusters("labels", unlabeled)


def test_kmeans_on_inputs_is_seeded_and_checks_k():
    rng = np.random.default_rng(0)
    points = np.concatenate([rng.normal(0, 0.1, (10, 3)), rng.normal(5, 0.1, (10, 3))])
    dataset = at.Dataset(inputs=points.astype(np.float32))
    ids = at.make_clusters("kmeans_inputs", dataset, k=2, seed=3)
    assert len(set(ids[:10])) == 1 and len(set(ids[10:])) == 1 and ids[0] != ids[10]
    assert (at.make_clusters("kmeans_inputs", dataset, k=2, seed=3) == ids).all()
    for bad_k in (None, 1, 21, 2.5, True):
        with pytest.raises(at.AttributionError, match="integer k from 2 to the number"):
            at.make_clusters("kmeans_inputs", dataset, k=bad_k)
    duplicates = at.Dataset(inputs=np.repeat(INPUTS[:2], 3, axis=0))
    with pytest.raises(at.AttributionError, match="only 2 distinct samples"):
        at.make_clusters("kmeans_inputs", duplicates, k=3)


def test_kmeans_on_conv_activations_uses_channel_means():
    conv = nn.Conv2d(1, 2, 1, bias=False)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([1.0, -1.0]).view(2, 1, 1, 1))
    model = nn.Sequential(conv, nn.Flatten(), nn.Linear(2 * 2 * 2, 2))
    images = torch.cat([torch.full((5, 1, 2, 2), -3.0), torch.full((5, 1, 2, 2), 3.0)])
    images += torch.linspace(0, 0.1, 10).view(10, 1, 1, 1)
    activations = layer_activations(model, "0", images, batch_size=4)
    assert activations.shape == (10, 2)
    torch.testing.assert_close(activations[:, 0], images.flatten(1).mean(1))
    ids = at.make_clusters("kmeans_activations", at.Dataset(inputs=images), model, layer="0",
                           k=2, batch_size=4)
    assert len(set(ids[:5])) == 1 and len(set(ids[5:])) == 1 and ids[0] != ids[5]


def test_streamed_samples_give_the_clusters_they_give_in_memory(tmp_path):
    """`make_clusters` on `StreamedData` (NpyRows, a list of batches) equals the in-memory
    `Dataset`'s clusters for every source that does not need all samples at once."""
    model = nn.Linear(3, 2)  # predicts 1 while x0 < 4.5: [1, 1, 0, 0]
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
        model.bias.copy_(torch.tensor([-4.5, 0.0]))
    np.save(tmp_path / "x.npy", INPUTS)
    memory = at.Dataset(inputs=INPUTS, labels=LABELS, clusters=["p", "q", "p", "q"])
    assert at.make_clusters("predicted", memory, model).tolist() == [1, 1, 0, 0]
    for inputs in (at.NpyRows(tmp_path / "x.npy", batch_size=3), [INPUTS[:3], INPUTS[3:]]):
        streamed = at.StreamedData(inputs, memory.labels, memory.clusters)
        for source in ("label", "predicted", "correctness", "provided"):
            np.testing.assert_array_equal(at.make_clusters(source, streamed, model),
                                          at.make_clusters(source, memory, model))
        for source in ("kmeans_inputs", "kmeans_activations"):
            with pytest.raises(at.AttributionError, match="needs the data in memory"):
                at.make_clusters(source, streamed, model, layer="", k=2)
    fractions = []
    at.make_clusters("predicted", at.StreamedData(at.NpyRows(tmp_path / "x.npy", batch_size=3)),
                     model, progress=fractions.append)
    assert fractions == [0.75, 1.0]
    fractions.clear()
    at.predict_classes(model, (batch for batch in (INPUTS[:3], INPUTS[3:])),
                       progress=fractions.append)  # of unknown length: NaN, not a fraction
    assert len(fractions) == 2 and np.isnan(fractions).all()
    with pytest.raises(at.AttributionError, match="needs labels"):
        at.make_clusters("label", at.StreamedData(at.NpyRows(tmp_path / "x.npy")))
