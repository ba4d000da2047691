"""The dashboard's cache keys (pages/shared/keys.py), built directly: equal settings give equal
keys, and every setting a result depends on changes its key."""
from dataclasses import replace

import pytest

from attribution.analyses.settings import AnalysisSettings
from pages.shared import keys

SETTINGS = AnalysisSettings(layer="relu2", method="gradient", compare=("ablation",),
                            cluster_source="label", k=8, cluster=3, reduce="mean",
                            target="true", fixed_class=0, metric="accuracy", n_random=20,
                            batch_size=256)


def test_digest_is_short_stable_and_tells_a_missing_part_from_an_empty_one():
    assert keys.digest(b"model", None) == keys.digest(b"model", None)
    assert len(keys.digest(b"model")) == 16
    assert keys.digest(b"model", None) != keys.digest(b"model", b"")
    assert keys.digest(b"ab", b"c") != keys.digest(b"a", b"bc")  # parts, not their join
    assert keys.digest(b"a", b"b") != keys.digest(b"b", b"a")


def test_workspace_keys_say_where_the_model_and_data_came_from():
    assert keys.demo_key("digits_mlp") == "demo:digits_mlp"
    model_key = keys.upload_model_key(b"weights", b"architecture")
    assert model_key == "model:" + keys.digest(b"weights", b"architecture")
    key = keys.upload_key(b"weights", b"architecture", b"data")
    assert key == "upload:" + keys.digest(b"weights", b"architecture", b"data", b"")
    assert key != keys.upload_key(b"weights", b"architecture", b"other data")
    assert key != keys.upload_key(b"weights", None, b"data")
    assert key != keys.upload_key(b"weights", b"architecture", b"data", "8x8")  # drawn so


def test_the_target_key_names_the_fixed_class_only_when_one_is_scored():
    assert keys.target_key(SETTINGS) == "true"
    assert keys.target_key(replace(SETTINGS, target="predicted", fixed_class=4)) == "predicted"
    assert keys.target_key(replace(SETTINGS, target="fixed", fixed_class=4)) == "fixed:4"


def test_the_cluster_key_holds_the_partition_and_the_cluster():
    assert keys.cluster_key(SETTINGS) == "label:8:relu2:3"
    assert keys.cluster_key(replace(SETTINGS, cluster_source="kmeans_inputs", k=5,
                                    cluster=0)) == "kmeans_inputs:5:relu2:0"


def test_the_curve_key_in_full():
    assert keys.curve_key("demo:digits_mlp", SETTINGS) == (
        "demo:digits_mlp", "relu2", "gradient", "true", "label:8:relu2:3", "mean", "accuracy",
        20, 256)


@pytest.mark.parametrize("change", [
    dict(layer="relu1"), dict(layer="relu2:1"), dict(method="ablation"),
    dict(cluster_source="predicted"), dict(k=5), dict(cluster=4), dict(reduce="mean_abs"),
    dict(target="predicted"), dict(metric="loss"), dict(n_random=5), dict(batch_size=64)])
def test_every_setting_a_curve_depends_on_changes_its_key(change):
    assert keys.curve_key("w", replace(SETTINGS, **change)) != keys.curve_key("w", SETTINGS)


def test_the_workspace_changes_the_curve_key():
    assert keys.curve_key("demo:digits_cnn", SETTINGS) != keys.curve_key("demo:digits_mlp",
                                                                         SETTINGS)


@pytest.mark.parametrize("change", [dict(compare=("gradient",)), dict(fixed_class=7)])
def test_settings_a_curve_does_not_depend_on_leave_its_key_alone(change):
    """The compared methods are drawn beside the main one; a fixed class counts only when
    the fixed class is scored."""
    assert keys.curve_key("w", replace(SETTINGS, **change)) == keys.curve_key("w", SETTINGS)
