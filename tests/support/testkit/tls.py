"""TLS for the tests: a CA with server and device certificates, and a mosquitto listener that
requires TLS, a password and (when asked) a client certificate."""

from __future__ import annotations

from pathlib import Path

from testkit.needs import missing


def make_certificates(folder: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    paths: dict[str, Path] = {}

    def issue(name: str, issuer_key, issuer_name, ca: bool, san: x509.GeneralName | None = None):
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer_name or subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if san is not None:
            builder = builder.add_extension(x509.SubjectAlternativeName([san]), critical=False)
        cert = builder.sign(issuer_key or key, hashes.SHA256())
        paths[f"{name}.pem"] = folder / f"{name}.pem"
        paths[f"{name}.pem"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        paths[f"{name}.key"] = folder / f"{name}.key"
        paths[f"{name}.key"].write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return key, subject

    ca_key, ca_name = issue("ca", None, None, True)
    issue("server", ca_key, ca_name, False, x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    issue("device", ca_key, ca_name, False)
    return paths


def secured_listener(folder: Path, client_certificate: bool) -> tuple[dict[str, Path], str]:
    """Certificates in `folder` and a mosquitto listener with TLS and the password file of one
    user, ``cam-1`` / ``s3cret`` (and client certificates required, when asked)."""
    import shutil
    import subprocess

    if shutil.which("mosquitto_passwd") is None:
        missing("mosquitto_passwd", "mosquitto_passwd is not installed (apt-get install mosquitto)")
    certs = make_certificates(folder)
    passwords = folder / "passwords"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(passwords), "cam-1", "s3cret"], check=True)
    listener = (
        f"cafile {certs['ca.pem']}\ncertfile {certs['server.pem']}\nkeyfile {certs['server.key']}\n"
        f"{'require_certificate true' if client_certificate else ''}\n"
        f"password_file {passwords}\nallow_anonymous false\n"
    )
    return certs, listener
