"""The cross-site check on its own (pure): properties over generated origins and hosts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rewind.api.security import STATE_CHANGING_METHODS, cross_site_reason, origin_of

hosts = st.sampled_from(["127.0.0.1", "localhost", "[::1]", "evil.example", "LOCALHOST"])
ports = st.one_of(st.none(), st.integers(min_value=1, max_value=65535))
schemes = st.sampled_from(["http", "https"])


def authority(host: str, port: int | None) -> str:
    return host if port is None else f"{host}:{port}"


@given(
    schemes, hosts, ports, schemes, hosts, ports, st.sampled_from(sorted(STATE_CHANGING_METHODS))
)
def test_a_state_changing_request_passes_exactly_when_its_origin_is_the_servers(
    scheme: str,
    host: str,
    port: int | None,
    o_scheme: str,
    o_host: str,
    o_port: int | None,
    method: str,
) -> None:
    served = {"host": authority(host, port)}
    origin = f"{o_scheme}://{authority(o_host, o_port)}"
    default = {"http": 80, "https": 443}
    same = (
        scheme == o_scheme
        and host.lower() == o_host.lower()
        and (port or default[scheme]) == (o_port or default[o_scheme])
    )
    assert (cross_site_reason(method, scheme, served | {"origin": origin}) is None) == same
    # Without Origin, the Referer's origin decides the same way (its path does not matter).
    referer = {"referer": f"{origin}/runs/abc?x=1#frag"}
    assert (cross_site_reason(method, scheme, served | referer) is None) == same


@given(st.text(max_size=40), st.sampled_from(["GET", "HEAD", "OPTIONS", "get"]))
def test_reads_are_never_refused(origin: str, method: str) -> None:
    headers = {"host": "127.0.0.1:8000", "origin": origin, "sec-fetch-site": "cross-site"}
    assert cross_site_reason(method, "http", headers) is None


@given(st.text(max_size=40))
def test_an_origin_that_is_not_an_http_url_is_refused(origin: str) -> None:
    if origin_of(origin) is not None:
        return
    headers = {"host": "127.0.0.1:8000", "origin": origin}
    reason = cross_site_reason("POST", "http", headers)
    assert reason is not None and "Origin" in reason


def test_default_ports_and_case_are_normalised() -> None:
    assert origin_of("HTTP://LocalHost") == ("http", "localhost", 80)
    assert origin_of("https://[::1]/x") == ("https", "::1", 443)
    assert origin_of("http://127.0.0.1:8765/page?q=1") == ("http", "127.0.0.1", 8765)
    for opaque in ("null", "file:///tmp/x.html", "data:text/html,x", "http://", "http://h:99999"):
        assert origin_of(opaque) is None, opaque


def test_fetch_metadata_and_opaque_origins() -> None:
    own = {"host": "127.0.0.1:8000"}
    for site in ("cross-site", "same-site", "Cross-Site"):
        reason = cross_site_reason("POST", "http", own | {"sec-fetch-site": site})
        assert reason is not None and "Sec-Fetch-Site" in reason
    # A no-referrer page sends Origin: null on its own POSTs; the browser vouches same-origin.
    assert (
        cross_site_reason("POST", "http", own | {"origin": "null", "sec-fetch-site": "same-origin"})
        is None
    )
    assert cross_site_reason("POST", "http", own | {"origin": "null"}) is not None
    assert cross_site_reason("POST", "http", own) is None  # curl, the CLI
    assert cross_site_reason("DELETE", "http", own | {"sec-fetch-site": "none"}) is None
