"""`ServingCert`: a TLS server context loaded from a certificate and key on disk (a mounted
Secret, as cert-manager writes one), loaded again when the files change, or given in memory
(`from_pem`, the controller's own certificate): new handshakes get the new certificate, open
connections keep theirs."""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import contextlib
import logging
import os
import ssl
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["TLS_READ_BUFFER", "ServingCert", "server_context", "small_tls_buffers"]

log = logging.getLogger(__name__)

TLS_READ_BUFFER = 32 * 1024
"""Bytes of the read buffer of each TLS connection on asyncio's loop: two TLS records."""
RELOAD_SECONDS = 60.0
"""How often the files are looked at: a rotated certificate is taken within this long."""


@contextlib.contextmanager
def _pem_files(cert: bytes, key: bytes) -> Iterator[tuple[str, str]]:
    """Paths to `cert` and `key`, for `load_cert_chain`, which reads only files: in memory
    (memfd) where Linux has it, so the key never touches a disk (the controller's root is
    read-only), else in a private temporary directory."""
    if hasattr(os, "memfd_create"):
        fds = [os.memfd_create(name, 0) for name in ("tls.crt", "tls.key")]
        try:
            for fd, data in zip(fds, (cert, key), strict=True):
                os.write(fd, data)
            yield f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}"
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory() as tmp:
        paths = [Path(tmp) / "tls.crt", Path(tmp) / "tls.key"]
        for path, data in zip(paths, (cert, key), strict=True):
            path.write_bytes(data)
        yield str(paths[0]), str(paths[1])


def small_tls_buffers() -> None:
    """Makes asyncio's TLS transport read through `TLS_READ_BUFFER` bytes per connection, not
    256 KiB (`SSLProtocol.max_size`, a class attribute every connection allocates): at N=1000
    agents' open streams, ~300 KiB per stream against ~14 KiB without TLS
    (docs/bench/arrivals_tls-2026-11-27.md). uvloop's own TLS holds ~45 KiB, but its memory
    grows by ~20 KiB with every connection opened and closed, which a Pod-mode restart does
    once per worker. For the whole process: the controller's client connections too."""
    asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER


def server_context() -> ssl.SSLContext:
    """The arrival endpoint's TLS settings, without its certificate."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # No TLS 1.3 session tickets (OpenSSL sends two after every handshake): an agent resumes
    # no session (a Pod-mode agent is a new process after each restart; a Process-mode one
    # keeps its connection), so each would be work and bytes for nothing.
    context.num_tickets = 0
    return context


class ServingCert:
    """The context to serve with (`context`), kept at the files' current certificate."""

    def __init__(self, cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str]):
        self.cert_file, self.key_file = Path(cert_file), Path(key_file)
        self.context = server_context()
        self._stamp = self._stat()
        self.context.load_cert_chain(self.cert_file, self.key_file)  # raises: bad files

    @classmethod
    def from_pem(cls, cert: bytes, key: bytes) -> ServingCert:
        """A context serving `cert` (PEM, the chain) with `key`; `load_pem` replaces them.
        Raises `ssl.SSLError` for a pair that does not load."""
        self = cls.__new__(cls)
        self.cert_file = self.key_file = Path()
        self._stamp = ()
        self.context = server_context()
        self.load_pem(cert, key)
        return self

    def load_pem(self, cert: bytes, key: bytes) -> None:
        """Serves `cert` and `key` to the next handshakes; raises `ssl.SSLError`, serving the
        old pair still, if they do not load together."""
        with _pem_files(cert, key) as (cert_path, key_path):
            # Tried on a spare context first, as in `reload`.
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_path, key_path)
            self.context.load_cert_chain(cert_path, key_path)

    def _stat(self) -> tuple[tuple[int, int, int], ...]:
        # A Secret's volume swaps a symlink: the target's (mtime, size, inode) changes.
        out = []
        for path in (self.cert_file, self.key_file):
            st = path.stat()
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(out)

    def reload(self) -> bool:
        """Loads the files again if they changed; True if it did. A pair that does not load
        (caught between the two files' writes) keeps the old one until the next look."""
        try:
            stamp = self._stat()
            if stamp == self._stamp:
                return False
            # Tried on a spare context first: a pair that fails half-loaded would leave the
            # serving one with a certificate and a key that do not match.
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(self.cert_file, self.key_file)
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as e:
            log.warning("serving certificate %s not reloaded: %s", self.cert_file, e)
            return False
        self._stamp = stamp
        log.info("serving certificate %s reloaded", self.cert_file)
        return True

    async def follow(self, every: float = RELOAD_SECONDS) -> None:
        """Reloads whenever the files change, until cancelled."""
        while True:
            await asyncio.sleep(every)
            self.reload()
