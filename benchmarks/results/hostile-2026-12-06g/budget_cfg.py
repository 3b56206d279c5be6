# A hostile trial's script (2026-12-06g), kept as it ran.
# ruff: noqa: B023, SIM115
# Hostile35 (b): every way to get a budget key wrong, in process. Prints each case's outcome
# and whether the secret appears in the message.
import os
import tempfile
import textwrap

from giul_asgi import Budget, EnergyMiddleware, Node, Route, Tier
from giul_asgi.config import load_config
from giul_asgi.tenants import hashed


async def app(scope, receive, send):
    pass


SECRET_SHORT = "sk-abcdEFGH1234secretXYZ"  # 24 safe chars
SECRET_OPENAI = "sk-proj-" + "Ab3_" * 39  # 164 chars, like an OpenAI project key
SECRET_BEARER = "Bearer sk-abcdEFGH1234secretXYZ"  # the header's whole value
H = hashed(SECRET_SHORT)
node = Node("h35cfg", reader="simulated", idle_w=60.0)
tiers = [Tier("70b", joules_per_1k_hint=4100.0), Tier("8b", joules_per_1k_hint=500.0)]
routes = [Route("/v1/chat/completions", node="h35cfg", tier="70b")]


def mw(budgets, **kw):
    kw.setdefault("tenant", "authorization")
    return EnergyMiddleware(app, nodes=[node], tiers=tiers, routes=routes, budgets=budgets, **kw)


def case(label, fn, secrets=()):
    try:
        fn()
        print(f"[ACCEPTED] {label}")
    except Exception as exc:
        msg = str(exc)
        leaked = [s[:12] + "..." for s in secrets if s in msg or s[:20] in msg]
        print(f"[{type(exc).__name__}{' LEAK ' + str(leaked) if leaked else ''}] {label}\n     {msg[:400]}")


case("raw short key, header tenant", lambda: mw([Budget(joules=100, key=SECRET_SHORT)]), [SECRET_SHORT])
case(
    "raw OpenAI-length key (164 chars), header tenant",
    lambda: mw([Budget(joules=100, key=SECRET_OPENAI)]),
    [SECRET_OPENAI],
)
case(
    "raw 'Bearer <key>' (the header's value)",
    lambda: mw([Budget(joules=100, key=SECRET_BEARER)]),
    [SECRET_SHORT],
)
case(
    "raw key in two budgets (hard + soft, same period)",
    lambda: mw([Budget(joules=100, key=SECRET_SHORT, hard=True), Budget(joules=80, key=SECRET_SHORT)]),
    [SECRET_SHORT],
)
case(
    "raw key, middleware has no tenant",
    lambda: mw([Budget(joules=100, key=SECRET_SHORT)], tenant=None),
    [SECRET_SHORT],
)
case("raw key, grams budget, no carbon", lambda: mw([Budget(grams=5, key=SECRET_SHORT)]), [SECRET_SHORT])
case(
    "raw key with trailing newline", lambda: mw([Budget(joules=100, key=SECRET_SHORT + "\n")]), [SECRET_SHORT]
)
case("hashed, uppercase hex", lambda: mw([Budget(joules=100, key=H.upper().replace("KEY:", "key:"))]))
case("hashed, 'KEY:' prefix", lambda: mw([Budget(joules=100, key="KEY:" + H[4:])]))
case("hashed, leading space", lambda: mw([Budget(joules=100, key=" " + H)]))
case("hashed, trailing space", lambda: mw([Budget(joules=100, key=H + " ")]))
case("hashed, 15 hex", lambda: mw([Budget(joules=100, key=H[:-1])]))
case("hashed, 17 hex", lambda: mw([Budget(joules=100, key=H + "0")]))
case("hashed, full sha256 (64 hex)", lambda: mw([Budget(joules=100, key="key:" + "a" * 64)]))
case("hashed OK (control)", lambda: mw([Budget(joules=100, key=H)]))
case("<none> (control)", lambda: mw([Budget(joules=100, key="<none>")]))
case("'<NONE>' uppercase", lambda: mw([Budget(joules=100, key="<NONE>")]))
case("' <none>' with space", lambda: mw([Budget(joules=100, key=" <none>")]))
case("'<other>' as key", lambda: mw([Budget(joules=100, key="<other>")]))
case(
    "callable tenant, key 'key:abc' (not 16 hex)",
    lambda: mw([Budget(joules=100, key="key:abc")], tenant=lambda s: "key:abc"),
)
case(
    "callable tenant, raw short key",
    lambda: mw([Budget(joules=100, key=SECRET_SHORT)], tenant=lambda s: None),
    [SECRET_SHORT],
)
case("tier budget key '<none>'", lambda: mw([Budget(joules=100, per="tier", key="<none>")]))
case("route budget key '<none>'", lambda: mw([Budget(joules=100, per="route", key="<none>")]))
case(
    "tenant_header= setting + raw key",
    lambda: mw([Budget(joules=100, key=SECRET_SHORT)], tenant=None, tenant_header="x-api-key"),
    [SECRET_SHORT],
)
case("tenant= and tenant_header= together", lambda: mw([], tenant="authorization", tenant_header="x-api-key"))
case(
    "tenant= and tenant_header= the same header",
    lambda: mw([], tenant="authorization", tenant_header="authorization"),
)
case("tenant=callable and tenant_header=", lambda: mw([], tenant=lambda s: "a", tenant_header="x-api-key"))
case("tenant='' (empty header name)", lambda: mw([], tenant=""))
case("tenant='' and tenant_header='x'", lambda: mw([], tenant="", tenant_header="x-api-key"))
case(
    "tenant='Authorization' (capitals) + hashed key",
    lambda: mw([Budget(joules=100, key=H)], tenant="Authorization"),
)
case("budgets as dicts with raw key", lambda: mw([{"joules": 100, "key": SECRET_SHORT}]), [SECRET_SHORT])
case(
    "budgets as dict with raw long key", lambda: mw([{"joules": 100, "key": SECRET_OPENAI}]), [SECRET_OPENAI]
)


def toml(text):
    d = tempfile.mkdtemp()
    p = os.path.join(d, "g.toml")
    open(p, "w").write(textwrap.dedent(text))
    return p


NODE = '[[node]]\nname = "h35cfg"\nreader = "simulated"\nidle_w = 60.0\n'
for label, body, secrets in [
    ("toml joules as string", '[[budget]]\njoules = "5e6"\n', []),
    ("toml hard as string", '[[budget]]\njoules = 5e6\nhard = "true"\n', []),
    ("toml period bool", "[[budget]]\njoules = 5e6\nperiod = true\n", []),
    ("toml key int", "[[budget]]\njoules = 5e6\nkey = 123\n", []),
    ("toml key array", '[[budget]]\njoules = 5e6\nkey = ["a"]\n', []),
    ("toml joules inf", "[[budget]]\njoules = inf\n", []),
    ("toml joules nan", "[[budget]]\njoules = nan\n", []),
    ("toml period 'Day '", '[[budget]]\njoules = 5e6\nperiod = "Day "\n', []),
    ("toml unknown key 'limit'", "[[budget]]\njoules = 5e6\nlimit = 3\n", []),
    ("toml misspelt table [[budgets]]", "[[budgets]]\njoules = 5e6\n", []),
    ("toml [budget] (a table, not array)", "[budget]\njoules = 5e6\n", []),
    ("toml budget = 5", "budget = 5\n", []),
    ("toml raw long key", f'[[budget]]\njoules = 5e6\nkey = "{SECRET_OPENAI}"\n', [SECRET_OPENAI]),
    ("toml raw key w/ space", f'[[budget]]\njoules = 5e6\nkey = "{SECRET_BEARER}"\n', [SECRET_SHORT]),
    (
        "toml unknown key with secret-looking name",
        f'[[budget]]\njoules = 5e6\n"{SECRET_SHORT}" = 1\n',
        [SECRET_SHORT],
    ),
]:
    case(label, lambda: load_config(toml(NODE + body)), secrets)

cfg = load_config(toml(NODE + '[[budget]]\njoules = 5e6\nname = "daily"\n'))
case("toml + python same name", lambda: mw([*cfg.budgets, Budget(joules=1, name="daily")]))
case("toml tenant budget, middleware without tenant", lambda: mw(list(cfg.budgets), tenant=None))
cfg2 = load_config(toml(NODE + f'[[budget]]\njoules = 5e6\nkey = "{SECRET_SHORT}"\n'))
case("toml raw short key (load ok?) then header middleware", lambda: mw(list(cfg2.budgets)), [SECRET_SHORT])
print("cfg2 budget names:", [b.name for b in cfg2.budgets])
case(
    "toml raw short key, middleware without tenant",
    lambda: mw(list(cfg2.budgets), tenant=None),
    [SECRET_SHORT],
)
