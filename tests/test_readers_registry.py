"""The registry: a factory per reader name, options checked by one helper that names the key."""

from __future__ import annotations

import pytest

from giul_asgi.errors import ConfigError, ReaderUnavailable
from giul_asgi.readers.base import NullReader, ReaderSpec
from giul_asgi.readers.registry import READERS, Options


def test_every_named_reader_has_a_factory() -> None:
    names = {"auto", "nvml", "agent", "dcgm", "dcgmi", "smi", "rapl", "amd", "simulated", "none"}
    assert names <= set(READERS)
    from giul_asgi.config import READER_KINDS

    assert set(READER_KINDS) <= set(READERS)  # every name a node may give builds a reader


def test_none_reads_nothing_and_takes_no_options() -> None:
    reader = READERS["none"](ReaderSpec(period=2.0, clock=lambda: 7.0))
    assert isinstance(reader, NullReader) and reader.period == 2.0
    reading = reader.read()
    assert reading.t == 7.0 and not reading.ok and "reader='none'" in (reading.error or "")
    with pytest.raises(ConfigError, match="unknown option 'x'"):
        READERS["none"](ReaderSpec(options={"x": 1}))


def test_nvml_on_this_host_is_unavailable_with_a_remedy_or_works() -> None:
    try:
        READERS["nvml"](ReaderSpec()).close()
    except ReaderUnavailable as exc:
        assert exc.remedy


@pytest.mark.parametrize(
    ("call", "match"),
    [(lambda o: o.number("n", 1.0), "'n' must be a number"),
     (lambda o: o.number("neg", 1.0), "'neg' must be > 0"),
     (lambda o: o.choice("c", ("a", "b"), "a"), "'c' must be one of"),
     (lambda o: o.text("t", None), "'t' must be a non-empty string"),
     (lambda o: o.flag("f", False), "'f' must be true or false"),
     (lambda o: o.ints("i"), "'i' must be a list of integers"),
     (lambda o: o.texts("s"), "'s' must be a list of strings")],
)
def test_options_name_the_bad_key(call: object, match: str) -> None:
    raw = {"n": "1", "neg": -1, "c": "z", "t": "", "f": "yes", "i": [True], "s": [3]}
    opts = Options(raw, "demo", raw)
    with pytest.raises(ConfigError, match=match):
        call(opts)  # type: ignore[operator]


def test_options_defaults_and_good_values() -> None:
    opts = Options({"n": 2, "i": 3, "s": "x", "f": True}, "demo", ("n", "i", "s", "f", "absent"))
    assert opts.number("n", 1.0) == 2.0 and opts.number("absent", 5.0) == 5.0
    assert opts.ints("i") == (3,) and opts.texts("s") == ("x",) and opts.flag("f", False) is True
    assert opts.ints("absent") is None and opts.choice("absent", ("a",), "a") == "a"
    with pytest.raises(ConfigError, match="unknown option 'zz'") as info:
        Options({"zz": 1}, "demo", ("n",))
    assert "'n'" in info.value.remedy
