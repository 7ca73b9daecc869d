"""`ServingCert`: a TLS server context loaded from a certificate and key on disk (a mounted
Secret, as cert-manager writes one), loaded again when the files change: new handshakes get the
new certificate, open connections keep theirs."""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from pathlib import Path

__all__ = ["ServingCert"]

log = logging.getLogger(__name__)

RELOAD_SECONDS = 60.0
"""How often the files are looked at: a rotated certificate is taken within this long."""


class ServingCert:
    """The context to serve with (`context`), kept at the files' current certificate."""

    def __init__(self, cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str]):
        self.cert_file, self.key_file = Path(cert_file), Path(key_file)
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._stamp = self._stat()
        self.context.load_cert_chain(self.cert_file, self.key_file)  # raises: bad files

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
