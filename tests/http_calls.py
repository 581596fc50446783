"""The tests' one-off HTTP calls: httpx's, with one generous deadline.

httpx waits 5 s by default. On a loaded 2-core CI machine a request to a service just
started took longer, once for a webhook and once for an upload whose body the gateway was
still reading: a deadline is what ends a call that hangs, not a guess at a fast answer.
A call or client that wants another deadline passes ``timeout=`` as it would to httpx.
"""

from __future__ import annotations

from functools import partial

import httpx

TIMEOUT_S = 30.0

get = partial(httpx.get, timeout=TIMEOUT_S)
post = partial(httpx.post, timeout=TIMEOUT_S)
put = partial(httpx.put, timeout=TIMEOUT_S)
patch = partial(httpx.patch, timeout=TIMEOUT_S)
delete = partial(httpx.delete, timeout=TIMEOUT_S)
stream = partial(httpx.stream, timeout=TIMEOUT_S)
Client = partial(httpx.Client, timeout=TIMEOUT_S)
AsyncClient = partial(httpx.AsyncClient, timeout=TIMEOUT_S)
