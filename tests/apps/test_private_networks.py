"""Which addresses an app may be called on: a table of addresses and the forms they hide in, then the same
table registered through the API by each role (only an operator may name private networks)."""

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from agentloop.api.app import create_app
from agentloop.apps.addresses import NetworkError, parse_networks, refusal
from agentloop.apps.base import ApiError
from agentloop.apps.remote_http import Origin, RemoteClient
from agentloop.store.db import get_sessionmaker
from agentloop.store.models import App
from tests.factories import bearer, make_keys

LOOPBACK_AND_TEN = ("127.0.0.0/8", "10.0.0.0/8", "::1/128")

# address as resolved, why it is refused by default (None: allowed), why with LOOPBACK_AND_TEN allowed
ADDRESSES = [
    ("8.8.8.8", None, None),
    ("2606:4700::1111", None, None),
    ("127.0.0.1", "loopback", None),
    ("::1", "loopback", None),
    ("10.1.2.3", "private", None),
    ("192.168.1.9", "private", "private"),
    ("fc00::1", "private", "private"),
    ("100.64.0.1", "not globally reachable", "not globally reachable"),  # carrier-grade NAT
    ("240.0.0.1", "reserved", "reserved"),
    ("169.254.169.254", "link-local", "link-local"),
    ("fe80::1", "link-local", "link-local"),
    ("0.0.0.0", '"this network" (0.0.0.0/8)', '"this network" (0.0.0.0/8)'),
    ("0.1.2.3", '"this network" (0.0.0.0/8)', '"this network" (0.0.0.0/8)'),
    ("::", "unspecified", "unspecified"),
    ("255.255.255.255", "broadcast", "broadcast"),
    ("224.0.0.1", "multicast", "multicast"),
    ("ff02::1", "multicast", "multicast"),
    # IPv6 forms of IPv4 addresses are judged as the IPv4 address
    ("::ffff:127.0.0.1", "loopback", None),
    ("::ffff:169.254.169.254", "link-local", "link-local"),
    ("::ffff:8.8.8.8", None, None),
    ("64:ff9b::7f00:1", "loopback", None),  # NAT64 of 127.0.0.1 (Python alone calls 64:ff9b::/96 global)
    ("64:ff9b::a9fe:a9fe", "link-local", "link-local"),
    ("64:ff9b::808:808", None, None),
    ("2002:7f00:1::", "loopback", None),  # 6to4 of 127.0.0.1
    ("2002:a9fe:a9fe::1", "link-local", "link-local"),
    ("2002:a00:1::", "private", None),  # 6to4 of 10.0.0.1
    ("::7f00:1", "reserved", "reserved"),  # IPv4-compatible (deprecated): refused as reserved
]


@pytest.mark.parametrize(("ip", "default", "with_allowed"), ADDRESSES)
def test_address_table(ip, default, with_allowed):
    assert refusal(ip) == default
    assert refusal(ip, parse_networks(LOOPBACK_AND_TEN)) == with_allowed


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ("169.254.0.0/16", "link-local"),
        ("169.254.169.254/32", "link-local"),
        ("0.0.0.0/0", "overlaps 169.254.0.0/16"),
        ("::/0", "overlaps fe80::/10"),
        ("fe80::/64", "link-local"),
        ("224.0.0.0/8", "multicast"),
        ("0.0.0.0/8", "this network"),
        ("::ffff:0:0/96", "name the IPv4 network instead"),
        ("::ffff:7f00:0/104", "name the IPv4 network instead"),
        ("64:ff9b::/96", "name the IPv4 network instead"),
        ("2002::/16", "name the IPv4 network instead"),
        ("10.0.0.1/8", "has host bits set"),
        ("10.0.0.0/33", "not a network in CIDR form"),
        ("intranet", "not a network in CIDR form"),
    ],
)
def test_networks_that_cannot_be_named(entry, needle):
    with pytest.raises(NetworkError, match=needle):
        parse_networks([entry])


def test_at_most_32_networks():
    with pytest.raises(NetworkError, match="at most 32"):
        parse_networks([f"10.{i}.0.0/16" for i in range(33)])


def test_a_call_checks_the_address_again():
    """Registration is not the only check: every call resolves and checks (a name can change its answer)."""
    client = RemoteClient(Origin.parse("http://127.0.0.1:9"), ())
    with pytest.raises(ApiError, match=r"127\.0\.0\.1 \(loopback\)"):
        client.request("get", "/x")


# --- through the API, by role ------------------------------------------------------------------------------

DOC = {"openapi": "3.1.0", "info": {"title": "x", "version": "1"}, "paths": {"/x": {"get": {"operationId": "x"}}}}

# base_url host, the address it resolves to (for the expectation), allowed with LOOPBACK_AND_TEN
HOSTS = [
    ("93.184.215.14", True),
    ("127.0.0.1", True),
    ("2130706433", True),  # decimal 127.0.0.1
    ("0x7f000001", True),  # hex
    ("0177.0.0.1", True),  # octal
    ("127.1", True),  # short form
    ("[::ffff:127.0.0.1]", True),
    ("[64:ff9b::7f00:1]", True),
    ("[2002:7f00:1::]", True),
    ("10.1.2.3", True),
    ("167837955", True),  # decimal 10.1.2.3
    ("192.168.0.1", False),  # not named
    ("169.254.169.254", False),
    ("2852039166", False),  # decimal 169.254.169.254
    ("0xa9fea9fe", False),  # hex 169.254.169.254
    ("[::ffff:169.254.169.254]", False),
    ("[::ffff:a9fe:a9fe]", False),
    ("[2002:a9fe:a9fe::]", False),
    ("[64:ff9b::a9fe:a9fe]", False),
    ("[fe80::1]", False),
    ("0.0.0.0", False),
    ("0", False),  # 0.0.0.0
    ("255.255.255.255", False),
    ("224.0.0.1", False),
]


@pytest.fixture
def api(sqlite_db):
    with get_sessionmaker()() as s:
        keys = make_keys(s)
    return TestClient(create_app()), keys


def app_rows() -> int:
    with get_sessionmaker()() as s:
        return s.scalar(sa.select(sa.func.count()).select_from(App))


@pytest.mark.parametrize(("host", "allowed_when_named"), HOSTS)
def test_registration_by_role(api, host, allowed_when_named):
    """Each host registered by an operator naming LOOPBACK_AND_TEN, by an operator, a tenant admin and a client
    naming nothing, and by a tenant admin naming the networks (403: only an operator may)."""
    client, keys = api
    globally_reachable = host == "93.184.215.14"
    cases = [
        ("operator", list(LOOPBACK_AND_TEN), 201 if allowed_when_named else 422),
        ("operator", [], 201 if globally_reachable else 422),
        ("tenant_a_admin", [], 201 if globally_reachable else 422),
        ("tenant_a_client", [], 201 if globally_reachable else 422),
        ("tenant_a_admin", list(LOOPBACK_AND_TEN), 403),
        ("tenant_a_client", ["10.0.0.0/8"], 403),
    ]
    for n, (role, networks, status) in enumerate(cases):
        before = app_rows()
        body = {"name": f"app_{n}", "openapi": DOC, "base_url": f"http://{host}:8080", "allowed_networks": networks}
        resp = client.post("/v1/apps", json=body, headers=bearer(getattr(keys, role)))
        assert resp.status_code == status, (role, networks, resp.text)
        if status == 201:
            assert resp.json()["allowed_networks"] == networks
            assert app_rows() == before + 1
        else:
            assert app_rows() == before  # nothing stored
            message = resp.json()["error"]["message"]
            assert ("operator key" in message) if status == 403 else ("allowed_networks" in message)


def test_a_refused_network_entry_is_a_clear_422(api):
    client, keys = api
    body = {"name": "meta", "openapi": DOC, "base_url": "http://10.0.0.5", "allowed_networks": ["169.254.0.0/16"]}
    resp = client.post("/v1/apps", json=body, headers=bearer(keys.operator))
    assert resp.status_code == 422 and "link-local" in resp.json()["error"]["message"]
    assert app_rows() == 0
