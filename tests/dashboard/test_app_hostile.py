"""Hostile uploads through the dashboard (AppTest): each is refused with a message, is not
loaded again on the reruns that follow, and leaves the app working on the demo."""
import pytest

from pages.shared import workspace
from tests.support.app import (GOOD_DATA, GOOD_MODEL, OCTET, assert_clean, figure, run_app,
                               sidebar_widget, upload)
from tests.support.hostile import (CondBomb, MatmulBomb, expanding_normalizer, exported,
                                   pickle_laughs, texts)


def counting(monkeypatch, name: str, replacement=None) -> list:
    """Count the calls of `workspace.<name>` (the loader the app uses), optionally
    replaced."""
    calls = []
    real = getattr(workspace, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return (replacement or real)(*args, **kwargs)

    monkeypatch.setattr(workspace, name, counted)
    return calls


def broken_loader(*args, **kwargs):
    raise TypeError("a failure no check anticipated")


HOSTILE = {  # name: (loader counted, replacement, model, data, words of the message)
    "pickle laughs as data": ("load_data", None, GOOD_MODEL,
                              ("d.pt", pickle_laughs(), OCTET), "expands"),
    "compute bomb as model": ("load_model", None, ("m.pt2", exported(MatmulBomb()), OCTET),
                              GOOD_DATA, "time budget of a first run"),
    "a loader failure that is no AttributionError": ("load_data", broken_loader, GOOD_MODEL,
                                                     GOOD_DATA, "TypeError"),
    "a cost behind a torch.cond as model": ("load_model", None,
                                            ("m.pt2", exported(CondBomb()), OCTET), GOOD_DATA,
                                            "chooses a branch by a tensor's value"),
    "a tokenizer whose normalizer explodes on the data": (
        "load_data", None, ("m.zip", expanding_normalizer(), OCTET),
        ("d.csv", texts("the movie here", 50), OCTET), "past its memory budget"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_upload_is_refused_once_and_the_demo_keeps_working(monkeypatch, name):
    loader, replacement, model, data, words = HOSTILE[name]
    app = run_app()  # the demo, loaded before counting
    calls = counting(monkeypatch, loader, replacement)
    app = upload(app, model, data)
    assert_clean(app)
    messages = [error.value.replace("\\", "") for error in app.error]
    assert len(messages) == 1 and words in messages[0], messages
    assert len(calls) == 1
    for _ in range(2):  # reruns (any widget change) show the recorded refusal, load nothing
        app.run()
        assert_clean(app)
        assert [error.value.replace("\\", "") for error in app.error] == messages
    assert len(calls) == 1
    assert sidebar_widget(app, "w_source").value == "digits_mlp"
    app.switch_page("pages/scores.py").run()
    assert_clean(app)
    assert figure(app, "score per cluster")
    assert len(calls) == 1


def test_the_model_and_data_page_says_how_uploads_are_isolated():
    from attribution.inputs.untrusted import jail

    app = run_app()
    app.switch_page("pages/data.py").run()
    assert_clean(app)
    captions = " ".join(caption.value for caption in app.caption)
    assert "read, and a model first run, in a jail" in captions
    assert jail.isolation() in captions and "bubblewrap" in captions
