# A stranger's trial script (2026-12-06e), kept as it ran.
import sys

from openai import OpenAI

url, key = sys.argv[1], sys.argv[2]
prefer = sys.argv[3] if len(sys.argv) > 3 else None
hdr = {"Prefer": prefer} if prefer else {}
client = OpenAI(base_url=url + "/v1", api_key=key, default_headers=hdr, max_retries=0)
for inc in (False, True):
    kw = {"stream_options": {"include_usage": True}} if inc else {}
    n = 0
    text = ""
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True, **kw
    )
    print(
        "include_usage",
        inc,
        "headers:",
        {
            k: v
            for k, v in raw.headers.items()
            if k in ("preference-applied", "vary", "x-energy-budget-remaining")
        },
    )
    for chunk in raw.parse():
        n += 1
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        e = chunk.model_extra.get("energy")
        if e:
            print("  chunk", n, "energy:", e if len(str(e)) < 200 else str(e)[:200] + "...")
        if chunk.usage:
            print("  usage:", chunk.usage)
    print("  chunks", n, "text", repr(text))
r = client.chat.completions.with_raw_response.create(
    model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4
)
c = r.parse()
print(
    "JSON: pref-applied",
    r.headers.get("preference-applied"),
    "vary",
    r.headers.get("vary"),
    "energy",
    str(c.model_extra.get("energy"))[:300],
)
