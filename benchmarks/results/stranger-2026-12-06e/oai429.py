# A stranger's trial script (2026-12-06e), kept as it ran.
# ruff: noqa: B007
import time

import openai
from openai import OpenAI

c = OpenAI(base_url="http://127.0.0.1:9410/v1", api_key="solo1")
t = time.time()
try:
    c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
except openai.RateLimitError as e:
    print(
        type(e).__name__,
        e.status_code,
        "code=",
        e.code,
        "type=",
        e.type,
        "| msg:",
        e.message[:150],
        "| %.2fs" % (time.time() - t),
    )
try:
    s = c.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
    )
    for ch in s:
        pass
except openai.RateLimitError as e:
    print("stream:", type(e).__name__, e.status_code, e.code, "| %.2fs" % (time.time() - t))
