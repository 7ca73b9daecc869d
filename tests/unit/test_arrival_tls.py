"""The agent's side of an arrival endpoint served over TLS, without a cluster: the agent
verifies the endpoint with the CA it is given (`GANGJOB_ARRIVAL_CA_FILE`) before its token
leaves it, arrives through it, and refuses an endpoint it cannot verify (arriving by
annotation instead); a plain-HTTP request to the TLS endpoint gets no answer.

The controller serves it with `ServingCert` (`--arrival-tls-cert-file`/`-key-file`), which takes
a rotated certificate for the next handshakes.

The certificates in testdata/arrival-tls are fixed and long-lived (100 years): `ca.crt` signed
`tls.crt`, `other-ca.crt` signed `other.crt` (both for 127.0.0.1 and localhost)."""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import contextlib
import dataclasses
import datetime
import pathlib
import shutil
import ssl
from collections.abc import AsyncIterator, Iterator

import pytest
from aiohttp import web

from agent.agent import Agent, Step
from agent.config import Config, ConfigError
from api.constants import ANNOTATION_EPOCH, ENV_ARRIVAL_CA, ENV_ARRIVAL_CA_PEM
from controller.arrivals.auth import Identity
from controller.arrivals.book import ArrivalBook
from controller.arrivals.server import arrivals_app
from controller.runtime import certs
from controller.runtime.httpserver import HttpServer
from controller.runtime.servingcert import TLS_READ_BUFFER, ServingCert, small_tls_buffers
from localcluster.procs import free_port
from tests.unit.test_agent import DEADLINE, JOB, NS, FakeApi, make_config, running, until

CERTS = pathlib.Path(__file__).parent / "testdata" / "arrival-tls"


@dataclasses.dataclass
class Served:
    fake: FakeApi
    book: ArrivalBook
    url: str
    port: int
    tokens_seen: list[str]


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    """`arrivals_app` over TLS on loopback, with `tls.crt`."""
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(CERTS / "tls.crt", CERTS / "tls.key")
    async with serve(tls) as ctl:
        yield ctl


@pytest.fixture
async def own() -> AsyncIterator[tuple[Served, dict[str, bytes]]]:
    """`arrivals_app` over TLS on loopback with a certificate the controller made itself
    (`controller.runtime.certs`, served from memory by `ServingCert.from_pem`)."""
    data = certs.renew(None, ["127.0.0.1"], datetime.datetime.now(datetime.UTC))
    assert data is not None
    serving = ServingCert.from_pem(data[certs.TLS_CERT], data[certs.TLS_KEY])
    async with serve(serving.context) as ctl:
        yield ctl, data


@contextlib.asynccontextmanager
async def serve(tls: ssl.SSLContext, fast: bool = True) -> AsyncIterator[Served]:
    fake, book, port = FakeApi(epoch=0), ArrivalBook(), free_port()
    ctl = Served(fake, book, f"https://127.0.0.1:{port}", port, [])

    async def authenticate(token: str) -> Identity:
        ctl.tokens_seen.append(token)
        pod, uid = token.split("/")
        return Identity(NS, pod, uid)

    app = arrivals_app(
        book,
        authenticate,
        lambda key: (fake.job or None) if key == f"{NS}/{JOB}" else None,
        pod_job=lambda ns, pod: JOB if pod in fake.pods else None,
        accepting=lambda: True,
        on_report=lambda key: None,
        # the fast path (as the controller serves it), its verdicts never cached: each report
        # reviewed, so `tokens_seen` says what came over the wire
        lookup=(lambda token: None) if fast else None,
    )
    async with HttpServer(app, "127.0.0.1", port, ssl_context=tls):
        yield ctl


def agent(served: Served, tmp_path: pathlib.Path, ca: str | None, **kw: object) -> Agent:
    token = tmp_path / "token"
    token.write_text("train-0/uid-train-0")
    served.fake.add_pod("train-0")
    served.fake.pods["train-0"]["metadata"]["uid"] = "uid-train-0"
    config = make_config(
        tmp_path,
        "train-0",
        pod_uid="uid-train-0",
        arrival_url=served.url,
        arrival_token_file=token,
        arrival_ca_file=CERTS / ca if ca else None,
        **kw,
    )
    return Agent(config, served.fake)


async def test_an_agent_arrives_over_tls_verified_by_the_ca_it_is_given(
    served: Served, tmp_path: pathlib.Path
) -> None:
    a = agent(served, tmp_path, "ca.crt")
    async with running(a):
        await until(a, lambda s: s.step == Step.AT_BARRIER and s.epoch == 0)
        held = served.book.get(NS, "train-0")
        assert held is not None
        assert held.epoch == 0
        assert served.fake.patches == []  # no annotation: the report went through TLS
        served.fake.set_status(barrierEpoch=0)
        served.book.job_changed(f"{NS}/{JOB}")
        await until(a, lambda s: s.barrier_open)  # the state line, read over TLS


async def refused(served: Served, a: Agent) -> None:
    """The agent, refusing the endpoint's certificate, arrives by annotation instead; the
    handshake failed before any request, so its token never left it."""
    async with running(a):
        await until(a, lambda s: s.step == Step.AT_BARRIER)
        assert served.tokens_seen == []
        assert served.book.get(NS, "train-0") is None
        assert served.fake.annotations("train-0") == {ANNOTATION_EPOCH: "0"}


async def test_an_agent_given_the_wrong_ca_refuses_the_endpoint(
    served: Served, tmp_path: pathlib.Path
) -> None:
    a = agent(served, tmp_path, "other-ca.crt", direct_fallback_seconds=0.3)
    await refused(served, a)


async def test_an_agent_given_the_ca_of_the_controllers_own_certificate_arrives_over_tls(
    own: tuple[Served, dict[str, bytes]], tmp_path: pathlib.Path
) -> None:
    served, data = own
    a = agent(served, tmp_path, None, arrival_ca_pem=data[certs.CA_CERT].decode())
    async with running(a):
        await until(a, lambda s: s.step == Step.AT_BARRIER and s.epoch == 0)
        held = served.book.get(NS, "train-0")
        assert held is not None
        assert held.epoch == 0
        assert served.fake.patches == []
        assert served.tokens_seen == ["train-0/uid-train-0"]


async def test_an_agent_given_another_ca_pem_refuses_the_controllers_own_certificate(
    own: tuple[Served, dict[str, bytes]], tmp_path: pathlib.Path
) -> None:
    served, _ = own
    other = certs.make_ca(datetime.datetime.now(datetime.UTC))[0].decode()
    a = agent(served, tmp_path, None, arrival_ca_pem=other, direct_fallback_seconds=0.3)
    await refused(served, a)


async def test_a_plain_http_request_to_the_controllers_own_tls_endpoint_gets_nothing(
    own: tuple[Served, dict[str, bytes]],
) -> None:
    await plain_http_gets_nothing(own[0])


async def test_an_agent_whose_ca_is_unreadable_arrives_by_annotation(
    served: Served, tmp_path: pathlib.Path
) -> None:
    a = agent(served, tmp_path, "missing.crt", direct_fallback_seconds=60)
    async with running(a):
        await until(a, lambda s: s.step == Step.AT_BARRIER)
        assert served.tokens_seen == []
        assert served.fake.annotations("train-0") == {ANNOTATION_EPOCH: "0"}


async def test_a_plain_http_request_to_the_tls_endpoint_gets_nothing(served: Served) -> None:
    await plain_http_gets_nothing(served)


async def plain_http_gets_nothing(served: Served) -> None:
    served.fake.add_pod("train-0")
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    body = b'{"namespace": "ns", "job": "train", "pod": "train-0", "uid": "u", "epoch": 0}'
    writer.write(
        b"POST /v1/arrivals HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer train-0/u\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
    )
    async with asyncio.timeout(DEADLINE):
        answer = await reader.read()  # until the server closes the connection
    writer.close()
    assert not answer.startswith(b"HTTP/")
    assert served.tokens_seen == []
    assert served.book.get(NS, "train-0") is None


def test_the_ca_is_read_from_the_environment_and_only_for_https() -> None:
    env = {
        "GANGJOB_NAME": JOB,
        "POD_NAME": "train-0",
        "POD_NAMESPACE": NS,
        "POD_UID": "u",
        "GANGJOB_ARRIVAL_URL": "https://gangjob-arrivals.gangjob-system.svc:8082",
        ENV_ARRIVAL_CA: "/var/run/secrets/gangjob.io/arrival/ca.crt",
    }
    config = Config.from_env(env)
    assert config.arrival_ca_file == pathlib.Path("/var/run/secrets/gangjob.io/arrival/ca.crt")
    assert Config.from_env({**env, ENV_ARRIVAL_CA: ""}).arrival_ca_file is None
    with pytest.raises(ConfigError, match=f"{ENV_ARRIVAL_CA} is set but .* is not https://"):
        Config.from_env({**env, "GANGJOB_ARRIVAL_URL": "http://127.0.0.1:8082"})
    pem = (CERTS / "ca.crt").read_text()
    assert Config.from_env({**env, ENV_ARRIVAL_CA_PEM: pem}).arrival_ca_pem == pem.strip()
    with pytest.raises(ConfigError, match=f"{ENV_ARRIVAL_CA_PEM} is set but .* is not https://"):
        Config.from_env(
            {
                **env,
                ENV_ARRIVAL_CA: "",
                ENV_ARRIVAL_CA_PEM: pem,
                "GANGJOB_ARRIVAL_URL": "http://127.0.0.1:8082",
            }
        )


async def handshake(port: int, ca: str) -> bool:
    """Whether a client trusting `ca` completes a TLS handshake with the server."""
    try:
        _, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=ssl.create_default_context(cafile=CERTS / ca)
        )
    except ssl.SSLCertVerificationError:
        return False
    writer.close()
    return True


async def test_the_controller_takes_a_rotated_certificate_for_new_handshakes(
    tmp_path: pathlib.Path,
) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(CERTS / "tls.crt", cert)
    shutil.copy(CERTS / "tls.key", key)
    serving = ServingCert(cert, key)
    assert not serving.reload()  # unchanged
    async with HttpServer(web.Application(), "127.0.0.1", 0, ssl_context=serving.context) as s:
        assert s.port is not None
        assert await handshake(s.port, "ca.crt")
        assert not await handshake(s.port, "other-ca.crt")
        # Caught between the two files' writes: the pair does not load, the old one serves.
        shutil.copy(CERTS / "other.crt", cert)
        assert not serving.reload()
        assert await handshake(s.port, "ca.crt")
        shutil.copy(CERTS / "other.key", key)
        assert serving.reload()
        assert await handshake(s.port, "other-ca.crt")
        assert not await handshake(s.port, "ca.crt")


def test_the_controller_refuses_half_a_tls_configuration() -> None:
    from controller.main import main

    assert main(["--arrival-tls-cert-file=/tmp/tls.crt"]) == 2


def test_the_controller_refuses_tls_files_for_an_http_url() -> None:
    from controller.main import main

    assert (
        main(
            [
                "--arrival-tls-cert-file=/tmp/tls.crt",
                "--arrival-tls-key-file=/tmp/tls.key",
                "--arrival-url=http://127.0.0.1:8082",
            ]
        )
        == 2
    )


async def test_the_controllers_own_certificate_renewed_is_served_to_new_handshakes() -> None:
    now = datetime.datetime.now(datetime.UTC)
    first = certs.renew(None, ["127.0.0.1"], now)
    second = certs.renew(None, ["127.0.0.1"], now)  # another CA: tells the two apart
    assert first is not None
    assert second is not None
    serving = ServingCert.from_pem(first[certs.TLS_CERT], first[certs.TLS_KEY])

    async def trusted_by(data: dict[str, bytes], port: int) -> bool:
        client = ssl.create_default_context(cadata=data[certs.CA_CERT].decode())
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
        except ssl.SSLCertVerificationError:
            return False
        writer.close()
        return True

    async with HttpServer(web.Application(), "127.0.0.1", 0, ssl_context=serving.context) as s:
        assert s.port is not None
        assert await trusted_by(first, s.port)
        with pytest.raises(ssl.SSLError):  # a key that is not the certificate's: not taken
            serving.load_pem(second[certs.TLS_CERT], first[certs.TLS_KEY])
        assert await trusted_by(first, s.port)
        serving.load_pem(second[certs.TLS_CERT], second[certs.TLS_KEY])
        assert await trusted_by(second, s.port)
        assert not await trusted_by(first, s.port)


@pytest.fixture
def small_buffers() -> Iterator[None]:
    """`small_tls_buffers` for one test: it changes a class attribute for the whole process."""
    before = asyncio.sslproto.SSLProtocol.max_size
    small_tls_buffers()
    try:
        yield
    finally:
        asyncio.sslproto.SSLProtocol.max_size = before


async def test_small_tls_buffers_carry_a_body_many_times_their_size(small_buffers: None) -> None:
    assert asyncio.sslproto.SSLProtocol.max_size == TLS_READ_BUFFER == 32 * 1024
    body = bytes(range(256)) * 4096  # 1 MiB: 32 buffers' worth each way

    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=await request.read())

    app = web.Application(client_max_size=2 * len(body))
    app.router.add_post("/", echo)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(CERTS / "tls.crt", CERTS / "tls.key")
    async with HttpServer(app, "127.0.0.1", 0, ssl_context=tls) as s:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", s.port, ssl=ssl.create_default_context(cafile=CERTS / "ca.crt")
        )
        writer.write(
            b"POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
        )
        async with asyncio.timeout(DEADLINE):
            answer = await reader.read()
        writer.close()
    assert answer.startswith(b"HTTP/1.1 200")
    assert answer.endswith(body)
