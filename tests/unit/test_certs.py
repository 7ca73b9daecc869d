"""The arrival endpoint's own CA and serving certificate (controller/runtime/certs.py): what
`renew` makes, what it keeps, and when it renews."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509

from controller.runtime.certs import (
    CA_CERT,
    CA_KEY,
    TLS_CERT,
    TLS_KEY,
    Lifetimes,
    due,
    make_ca,
    renew,
    service_names,
)

T0 = datetime.datetime(2026, 11, 27, 12, 0, tzinfo=datetime.UTC)
NAMES = service_names("gangjob-arrivals.gangjob-system.svc")
DAY = datetime.timedelta(days=1)


def cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def sans(pem: bytes) -> list[str]:
    ext = cert(pem).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    return list(ext.value.get_values_for_type(x509.DNSName))


def test_the_names_of_a_service_are_its_short_and_long_forms() -> None:
    assert NAMES == [
        "gangjob-arrivals.gangjob-system.svc",
        "gangjob-arrivals",
        "gangjob-arrivals.gangjob-system",
        "gangjob-arrivals.gangjob-system.svc.cluster.local",
    ]
    assert service_names("127.0.0.1") == ["127.0.0.1"]


def test_an_empty_secret_gets_a_ca_and_a_serving_certificate_signed_by_it() -> None:
    data = renew(None, NAMES, T0)
    assert data is not None
    assert set(data) == {CA_CERT, CA_KEY, TLS_CERT, TLS_KEY}
    ca, serving = cert(data[CA_CERT]), cert(data[TLS_CERT])
    serving.verify_directly_issued_by(ca)
    assert sorted(sans(data[TLS_CERT])) == sorted(NAMES)
    assert ca.not_valid_after_utc - T0 == 3650 * DAY
    assert serving.not_valid_after_utc - T0 == 90 * DAY


def test_what_is_fresh_is_kept() -> None:
    data = renew(None, NAMES, T0)
    assert data is not None
    assert renew(data, NAMES, T0 + 59 * DAY) is None


def test_the_serving_certificate_is_renewed_at_two_thirds_of_its_life_the_ca_kept() -> None:
    data = renew(None, NAMES, T0)
    assert data is not None
    later = renew(data, NAMES, T0 + 61 * DAY)
    assert later is not None
    assert later[CA_CERT] == data[CA_CERT]
    assert later[CA_KEY] == data[CA_KEY]
    assert later[TLS_CERT] != data[TLS_CERT]
    cert(later[TLS_CERT]).verify_directly_issued_by(cert(data[CA_CERT]))
    assert cert(later[TLS_CERT]).not_valid_before_utc <= T0 + 61 * DAY


def test_a_serving_certificate_for_other_names_or_keys_is_made_again() -> None:
    data = renew(None, NAMES, T0)
    assert data is not None
    renamed = renew(data, service_names("gangjob-arrivals.other.svc"), T0)
    assert renamed is not None
    assert renamed[CA_CERT] == data[CA_CERT]
    assert "gangjob-arrivals.other.svc" in sans(renamed[TLS_CERT])
    other = renew(None, NAMES, T0)
    assert other is not None
    for broken in (
        {**data, TLS_KEY: other[TLS_KEY]},  # a key of another certificate
        {**data, TLS_CERT: other[TLS_CERT], TLS_KEY: other[TLS_KEY]},  # another CA's pair
        {k: v for k, v in data.items() if k != TLS_CERT},  # deleted to force a renewal
        {**data, TLS_CERT: b"garbage"},
    ):
        fixed = renew(broken, NAMES, T0)
        assert fixed is not None
        assert fixed[CA_CERT] == data[CA_CERT]
        cert(fixed[TLS_CERT]).verify_directly_issued_by(cert(data[CA_CERT]))


@pytest.mark.parametrize(
    "change",
    [
        {CA_KEY: b""},  # its key lost
        {CA_CERT: b"not a certificate"},
    ],
)
def test_a_ca_without_its_key_is_made_again_with_its_certificate(
    change: dict[str, bytes],
) -> None:
    data = renew(None, NAMES, T0)
    assert data is not None
    fixed = renew({**data, **change}, NAMES, T0)
    assert fixed is not None
    assert fixed[CA_CERT] != data[CA_CERT]
    cert(fixed[TLS_CERT]).verify_directly_issued_by(cert(fixed[CA_CERT]))


def test_the_ca_is_renewed_at_two_thirds_of_its_life() -> None:
    short = Lifetimes(ca_days=30, serving_days=9)
    data = renew(None, NAMES, T0, short)
    assert data is not None
    assert renew(data, NAMES, T0 + 5 * DAY, short) is None
    kept = renew(data, NAMES, T0 + 7 * DAY, short)  # the serving cert due, the CA not
    assert kept is not None
    assert kept[CA_CERT] == data[CA_CERT]
    renewed = renew(kept, NAMES, T0 + 21 * DAY, short)
    assert renewed is not None
    assert renewed[CA_CERT] != data[CA_CERT]


def test_a_serving_certificate_never_outlives_its_ca() -> None:
    short = Lifetimes(ca_days=30, serving_days=90)
    data = renew(None, NAMES, T0, short)
    assert data is not None
    assert cert(data[TLS_CERT]).not_valid_after_utc == cert(data[CA_CERT]).not_valid_after_utc


def test_due_counts_from_not_before() -> None:
    ca = cert(make_ca(T0, days=30)[0])
    assert not due(ca, T0)
    assert not due(ca, T0 + 19 * DAY)
    assert due(ca, T0 + 21 * DAY)
    assert due(ca, T0 - DAY)  # a clock set back before it began


def test_an_ip_address_is_named_as_one() -> None:
    data = renew(None, ["127.0.0.1"], T0)
    assert data is not None
    ext = cert(data[TLS_CERT]).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert [str(ip) for ip in ext.value.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert renew(data, ["127.0.0.1"], T0) is None
