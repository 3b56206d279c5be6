from __future__ import annotations

import re
from pathlib import Path

import pytest

from giul_asgi import ConfigError, Node, Route, Tier, load_config


def test_node_normalises_and_validates() -> None:
    node = Node("a", gpus=[0, 1], idle_w=120)  # type: ignore[arg-type]
    assert node.gpus == (0, 1) and node.idle_w == 120.0
    assert Node("b", gpus=3).gpus == (3,)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="idle_w must be >= 0"):
        Node("a", idle_w=-1)
    with pytest.raises(ConfigError, match=r"idle_w must be a number.*give idle_w an int or a float"):
        Node("a", idle_w="80")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"joules_per_1k_hint must be a number.*give joules_per_1k_hint"):
        Tier("small", joules_per_1k_hint="lots")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"reader=.* is not one of"):
        Node("a", reader="magic")
    with pytest.raises(ConfigError, match=r"split=.* is not one of"):
        Node("a", split="by-vibes")
    with pytest.raises(ConfigError, match="gpus must be a list"):
        Node("a", gpus=("x",))  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        Node("")


def test_idle_is_never_guessed() -> None:
    assert Node("a").idle_w is None


def test_tier_and_route() -> None:
    assert Tier("70b", joules_per_1k_hint=4100).joules_per_1k_hint == 4100.0
    with pytest.raises(ConfigError, match="joules_per_1k_hint"):
        Tier("x", joules_per_1k_hint=float("nan"))
    Route(re.compile(r"^/v1/.*$"), node="a")
    with pytest.raises(ConfigError, match=r"route\.pattern"):
        Route("", node="a")


def test_load_from_dicts() -> None:
    cfg = load_config({
        "node": [{"name": "h100-a", "gpus": [0, 1], "idle_w": 140.0, "reader": "simulated", "url": "http://127.0.0.1:8001"}],
        "tier": [{"name": "70b", "joules_per_1k_hint": 4100}],
        "route": [{"pattern": "/v1/chat/completions", "node": "h100-a", "tier": "70b"}],
    })
    assert cfg.nodes[0].gpus == (0, 1) and cfg.tiers[0].name == "70b"
    assert cfg.routes[0].node == "h100-a"


def test_load_from_toml(tmp_path: Path) -> None:
    path = tmp_path / "giul.toml"
    path.write_text(
        '[[node]]\nname = "a"\ngpus = [0]\nidle_w = 80\n\n'
        '[[tier]]\nname = "8b"\njoules_per_1k_hint = 300.0\n\n'
        '[[route]]\npattern = "/v1/*"\nnode = "a"\ntier = "8b"\n'
    )
    cfg = load_config(path)
    assert cfg.nodes[0].idle_w == 80.0 and cfg.routes[0].pattern == "/v1/*"


def test_budgets_come_from_toml_and_hold_as_given_in_python(tmp_path: Path) -> None:
    from giul_asgi import Budget, EnergyMiddleware, Ledgers

    path = tmp_path / "giul.toml"
    path.write_text(
        '[[node]]\nname = "a"\nreader = "none"\n\n[[tier]]\nname = "8b"\njoules_per_1k_hint = 300.0\n\n'
        '[[budget]]\njoules = 5e6\nper = "tier"\nkey = "8b"\nperiod = "hour"\nhard = true\n'
    )
    cfg = load_config(path)
    assert cfg.budgets == (Budget(joules=5e6, per="tier", key="8b", period="hour", hard=True),)

    async def app(scope: object, receive: object, send: object) -> None: ...

    metered = EnergyMiddleware(app, cfg.nodes, cfg.tiers, cfg.routes, ledgers=Ledgers(),
                               budgets=cfg.budgets)
    assert metered.budgets is not None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"node": [{"name": "a", "idle": 80}]}, "node\\[0\\]: unknown key 'idle'"),
        ({"nodes": []}, "unknown top-level key 'nodes'"),
        ({"budgets": [{"joules": 1.0}]}, "unknown top-level key 'budgets'"),
        ({"budget": [{"joules": 1.0, "perr": "tier"}]}, "budget\\[0\\]: unknown key 'perr'"),
        ({"budget": [{"joules": 1.0}, {"joules": -1.0}]}, "budget\\[1\\]: .*must be a number > 0"),
        ({"route": [{"pattern": "/x", "node": "ghost"}]}, "route\\[0\\].node: no node named"),
        ({"node": [{"name": "a"}, {"name": "a"}]}, "two nodes are named 'a'"),
        ({"tier": ["70b"]}, "tier\\[0\\] must be a table"),
        ({"route": [{"pattern": "/x", "tier": "ghost"}]}, "route\\[0\\].tier: no tier named"),
    ],
)
def test_bad_config_names_the_bad_key(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(data)


def test_a_bad_key_in_a_file_names_the_file(tmp_path: Path) -> None:
    toml = tmp_path / "giul.toml"
    toml.write_text('[[node]]\nname = "a"\nreder = "none"\n')
    with pytest.raises(ConfigError, match=r"giul\.toml: node\[0\]: unknown key 'reder'") as raised:
        load_config(toml)
    assert str(raised.value).count("giul.toml") == 1, raised.value


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[[node]\nname=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")


def test_new_node_keys_are_checked_with_their_remedy() -> None:
    import pytest

    from giul_asgi import ConfigError, Node

    with pytest.raises(ConfigError, match="needs a url") as caught:
        Node("gpu", reader="agent")
    assert "agent endpoint" in caught.value.remedy
    Node("sim", reader="simulated")  # no url: the in-process simulated card (tests/test_simulated.py)
    with pytest.raises(ConfigError, match=r"foreign=.* is not one of"):
        Node("a", foreign="ignore")
    with pytest.raises(ConfigError, match="ramp_s must be >= 0"):
        Node("a", ramp_s=-0.1)
    with pytest.raises(ConfigError, match="upstream must start with http"):
        Node("a", upstream="vllm:8000/metrics")
    with pytest.raises(ConfigError, match="serving must be a process name or a PID"):
        Node("a", serving=True)  # type: ignore[arg-type]
    node = Node("a", reader="agent", url="http://gpu-7:9431", foreign="subtract", serving="vllm")
    assert node.foreign == "subtract" and node.ramp_s == 0.1 and hash(node) == hash(node)


def test_a_misspelt_keyword_of_a_record_is_a_config_error_that_says_which_was_meant() -> None:
    """A stranger's trial: ``Node(..., idle_ww=140.0)`` was Python's bare ``TypeError``."""
    from giul_asgi import Budget

    # The record named where it is (a stranger's trial could not tell which node it was)
    with pytest.raises(ConfigError,
                       match=r"^Node 'n': idle_ww= is not a Node setting\. did you mean idle_w=\?$"):
        Node("n", idle_ww=140.0)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match=r"^Node 'n': idle_ww= is not a Node setting"):
        Node(name="n", idle_ww=140.0)  # type: ignore[call-arg]
    with pytest.raises(ConfigError,
                       match=r"^Route '/v1/\*': teir= is not a Route setting\. did you mean tier=\?"):
        Route("/v1/*", teir="70b")  # type: ignore[call-arg]
    with pytest.raises(ConfigError,
                       match=r"^Budget: jouls= is not a Budget setting\. did you mean joules=\?"):
        Budget(jouls=5.0)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match=r"Tier\(\.\.\.\): takes .* give Tier's settings by name"):
        Tier("70b", 1.0, 2.0)  # type: ignore[call-arg]


def test_a_record_made_wrong_while_a_module_is_imported_keeps_its_error_for_the_startup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where a server imports the app, a bad Node does not raise there (a traceback, and a
    crash loop under ``uvicorn --workers``): it keeps its error, and whatever is given it (the
    middleware's settings, a Ledger) raises it, so the startup fails with its one line."""
    import importlib

    from giul_asgi.config import settings_list
    from giul_asgi.deferred import startup_error
    from giul_asgi.ledger import Ledger

    (tmp_path / "bad_nodes.py").write_text(
        "from giul_asgi import Node, Tier\nnode = Node('n', idle_w=-140.0)\ntypo = Node('m', idle_ww=1.0)\n"
        "tier = Tier('t', joules_per_1k_hint=-1.0)\nlisted = Node('l', gpus=[0, 1], idle_w=-1.0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("bad_nodes")
    for record, words in ((module.node, "idle_w must be >= 0"), (module.typo, "did you mean idle_w=")):
        kept = startup_error(record)
        assert isinstance(kept, ConfigError) and words in str(kept)
        with pytest.raises(ConfigError) as raised:
            settings_list("nodes", [record], Node, "Node(...)")
        assert raised.value is kept
        with pytest.raises(ConfigError):
            Ledger(record, None, poll=False)
    assert startup_error(Node("fine", idle_w=1.0)) is None
    from giul_asgi import Ledgers, Meter

    with pytest.raises(ConfigError, match="joules_per_1k_hint"):  # a re-trial: an unknown figure
        Meter.for_node(None, module.tier, ledgers=Ledgers())
    # A hostile trial: a kept record failed repr, == and hash (fields never set).
    assert "idle_ww" not in repr(module.typo) and module.typo == module.typo
    assert len({module.typo, module.node, module.listed}) == 3  # a list given is not kept: its hash
    assert module.node.name == "n" and module.node.idle_w == -140.0  # the values it was given


def test_a_misspelt_keyword_is_also_the_type_error_python_would_raise() -> None:
    """uvicorn --factory says a factory's TypeError in one line; a ConfigError alone (a
    ValueError) was a 48-line traceback there (a hostile trial)."""
    with pytest.raises(TypeError, match="did you mean idle_w="):
        Node("n", idle_ww=1.0)  # type: ignore[call-arg]


def test_settings_of_the_wrong_shape_are_refused_with_the_shape_that_works() -> None:
    from giul_asgi.config import settings_list

    for value, words in ((Node("a"), "nodes= takes a list"), ({Node("a"), Node("b")}, "got set"),
                         ([{"name": "a"}], "nodes[0] is dict"), (["a"], "nodes[0] is str")):
        with pytest.raises(ConfigError, match=re.escape(words)):
            settings_list("nodes", value, Node, "Node(...)")
    assert settings_list("nodes", (n for n in [Node("a")]), Node, "Node(...)") == [Node("a")]


def test_every_giul_asgi_variable_name_is_one_the_package_reads() -> None:
    from giul_asgi.environment import VARIABLES, check_environment

    check_environment({"GIUL_ASGI_LOAD_DIR": "off", "GIUL_ASGI_SWITCH_INTERVAL": "0.002",
                       "GIUL_DEMO_PORT": "1"})
    for name, meant in (("GIUL_ASGI_LOAD_DIRS", "did you mean GIUL_ASGI_LOAD_DIR?"),
                        ("GIUL_ASGI_SWITCHINTERVAL", "did you mean GIUL_ASGI_SWITCH_INTERVAL?"),
                        ("GIUL_ASGI_COLOUR", "rename or unset it")):
        with pytest.raises(ConfigError) as caught:
            check_environment({name: "off"})
        assert meant in str(caught.value) and all(v in str(caught.value) for v in VARIABLES)
    with pytest.raises(ConfigError) as caught:
        check_environment({"GIUL_ASGI_TRACE": "1"})  # shares only the prefix with any of them
    assert "did you mean" not in str(caught.value)


def test_gpus_that_are_not_indices_say_how_to_write_them_in_python_and_in_toml() -> None:
    """A stranger's trial: ``Node(..., gpus="0,1")`` in a Python app was told to write TOML."""
    with pytest.raises(ConfigError) as caught:
        Node("h100-a", gpus="0,1")  # type: ignore[arg-type]
    said = f"{caught.value} {caught.value.remedy}"
    assert "node 'h100-a'" in said and "gpus=(0, 1) in Python" in said and "gpus = [0, 1] in TOML" in said


def test_a_switch_interval_is_never_suggested_off_for_a_word_that_is_not_near_off() -> None:
    """A stranger's trial: =fast was asked whether it meant =false, which turns it off."""
    from giul_asgi.switch import check_environment

    for value, meant in (("fast", None), ("offf", "did you mean GIUL_ASGI_SWITCH_INTERVAL=off?"),
                         ("1.5", None)):
        with pytest.raises(ConfigError) as caught:
            check_environment({"GIUL_ASGI_SWITCH_INTERVAL": value})
        said = f"{caught.value} {caught.value.remedy}"
        assert (meant in said) if meant else ("did you mean" not in said), said
        assert "or off to leave CPython's interval alone" in said


BAD_PATHS: list[tuple[dict[str, object], str]] = [
    ({"metrics_path": "metrics"}, "must start with /"),
    ({"energy_path": "energy/"}, "must start with /"),
    ({"metrics_path": "/energy/metrics"}, "lies inside energy_path"),
    ({"energy_path": "/metrics", "metrics_path": "/metrics"}, "lies inside energy_path"),
    ({"energy_path": "/metrics", "metrics_path": "prom"}, "must start with /"),  # not told "/metrics"
    ({"energy_path": "/energy "}, "no spaces, query or fragment"),
    ({"energy_path": "/energy?x=1"}, "no spaces, query or fragment"),
    ({"metrics_path": "/met rics", "energy_path": "/metrics-not"}, "no spaces, query or fragment"),
]


@pytest.mark.parametrize(("settings", "said"), BAD_PATHS, ids=[str(s) for s, _ in BAD_PATHS])
def test_a_bad_path_is_refused_with_a_remedy_that_is_itself_taken(
    settings: dict[str, object], said: str,
) -> None:
    from giul_asgi.asgi.options import Options

    with pytest.raises(ConfigError, match=said) as caught:
        Options.build(**settings)
    example = re.search(r'(\w+_path)="([^"]+)"', caught.value.remedy)
    assert example is not None, caught.value.remedy
    fixed = {**settings, example.group(1): example.group(2)}
    Options.build(**fixed)  # what the remedy says works
