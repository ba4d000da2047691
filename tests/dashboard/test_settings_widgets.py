"""The dashboard's widgets of the settings (the sidebar's and the Pruning page's) are drawn
from `attribution.analyses.settings.SETTINGS`, the rows the command line's options are made
from (tests/analyses/test_settings_table.py): a changed row changes the widget."""
from dataclasses import replace

from attribution.analyses.settings import SETTINGS
from pages.shared import workspace
from tests.support.app import assert_clean, run_app, sidebar_widget


def test_every_widget_of_a_setting_says_its_row_and_offers_its_menu(monkeypatch):
    """Every row with a widget key, its label and help replaced by markers, is drawn with
    them; a row's menu and default, changed, are the widget's options and first value."""
    for name, setting in SETTINGS.items():
        if setting.key:
            monkeypatch.setitem(SETTINGS, name, replace(setting, label=f"Label {name}",
                                                        help=f"Help {name}."))
    monkeypatch.setitem(SETTINGS, "reduce", replace(
        SETTINGS["reduce"], default="mean_abs", menu_for=lambda facts: ("mean_abs", "mean")))
    monkeypatch.setitem(SETTINGS, "batch_size", replace(SETTINGS["batch_size"], default=64,
                                                        choices=(16, 64)))
    loaded, _ = workspace._demo("digits_cnn")
    layer = next(info.name for info in loaded.layers() if info.positions)  # "Neurons along"
    app = run_app({"source": "digits_cnn", "layer": layer, "cluster_by": "kmeans_activations",
                   "target": "fixed"})  # k and the class drawn too
    assert_clean(app)
    drawn = {name: sidebar_widget(app, setting.key) for name, setting in SETTINGS.items()
             if setting.key and name not in ("metric", "n_random")}
    app.switch_page("pages/pruning.py").run()
    assert_clean(app)
    drawn |= {widget.key.removeprefix("w_").replace("random", "n_random"): widget
              for widget in [*app.main.selectbox, *app.main.select_slider]
              if widget.key in ("w_metric", "w_random")}
    assert set(drawn) == {name for name, setting in SETTINGS.items() if setting.key}
    for name, widget in drawn.items():
        assert (widget.label, widget.help) == (f"Label {name}", f"Help {name}."), name
        assert widget.key == SETTINGS[name].key
    assert list(drawn["reduce"].options) == ["mean |·|", "signed mean"]
    assert drawn["reduce"].value == "mean_abs"
    assert list(drawn["batch_size"].options) == ["16", "64"] and drawn["batch_size"].value == 64
