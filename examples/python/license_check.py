#!/usr/bin/env python3
"""A client of a self-hosted license service, as an application would embed it: validate a license
for this machine, verify the signed answer with the app's public key, send one heartbeat, and check
an offline `.authforge` license file. Python 3.8+, the standard library plus `cryptography`.

Exit codes: 0 the license is good; 1 it was refused or an answer failed verification; 2 bad usage.
"""
import argparse
import base64
import binascii
import json
import os
import re
import secrets
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

SETTINGS = {
    "base-url": "LS_BASE_URL",
    "app-id": "LS_APP_ID",
    "app-secret": "LS_APP_SECRET",
    "public-key": "LS_PUBLIC_KEY",
    "license-key": "LS_LICENSE_KEY",
    "hwid": "LS_HWID",
    "offline-file": "LS_OFFLINE_FILE",
}


class Refused(Exception):
    """The license was refused, or an answer is not what the server signed for this request: exit 1."""


class BadUsage(Exception):
    """A setting is missing or malformed: exit 2."""


def read_settings(argv):
    parser = argparse.ArgumentParser(
        description="Check a license: online (validate + heartbeat) when a license key is given, "
        "offline when an offline file is given. --public-key takes several keys, comma-separated."
    )
    for flag, env in SETTINGS.items():
        parser.add_argument(f"--{flag}", dest=flag, help=f"or {env}")
    args = vars(parser.parse_args(argv))
    s = {flag: (args[flag] or os.environ.get(env, "")).strip() for flag, env in SETTINGS.items()}
    online, offline = s["license-key"] != "", s["offline-file"] != ""
    if not online and not offline:
        raise BadUsage("give a license key (online check), an offline file, or both")
    required = ["app-id", "public-key", "hwid"] + (["base-url", "app-secret"] if online else [])
    missing = [f"--{flag} ({SETTINGS[flag]})" for flag in required if s[flag] == ""]
    if missing:
        raise BadUsage("missing " + ", ".join(missing))
    s["keys"] = [trusted_key(k) for k in s["public-key"].split(",")]
    return s, online, offline


def trusted_key(text):
    """The app's public key as the Developer API and the CLI give it: the raw 32-byte Ed25519 key, base64."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except binascii.Error:
        raw = b""
    if len(raw) != 32:
        raise BadUsage('a public key must be 32 bytes, base64 (as "publicKey" is given)')
    return Ed25519PublicKey.from_public_bytes(raw)


def signed_by_trusted_key(text, signature_b64, keys):
    """Ed25519 over the UTF-8 bytes of the base64 text exactly as received, by any trusted key (rotation)."""
    try:
        signature = base64.b64decode(signature_b64, validate=True)
    except binascii.Error:
        return False
    for key in keys:
        try:
            key.verify(signature, text.encode("utf-8"))
            return True
        except InvalidSignature:
            continue
    return False


def post(base_url, path, body):
    request = urllib.request.Request(
        base_url.rstrip("/") + path,
        data=json.dumps(body).encode("utf-8"),
        headers={"content-type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=15) as res:
            status, text = res.status, res.read()
    except urllib.error.HTTPError as err:  # a 4xx/5xx still carries the JSON failure body
        status, text = err.code, err.read()
    except (urllib.error.URLError, OSError) as err:
        raise Refused(f"cannot reach {base_url}: {getattr(err, 'reason', err)}")
    try:
        reply = json.loads(text)
    except ValueError:
        reply = None
    if not isinstance(reply, dict) or status >= 400 or reply.get("status") != "success":
        code = reply.get("error") if isinstance(reply, dict) else "no JSON answer"
        raise Refused(f"{path} refused: {code} (HTTP {status})")
    return reply


def open_signed(path, reply, keys, nonce):
    """Verifies first, then decodes (never parse what is not signed), then checks the nonce echo."""
    payload_b64, signature = reply.get("payload"), reply.get("signature")
    if not isinstance(payload_b64, str) or not isinstance(signature, str):
        raise Refused(f"{path}: the answer has no payload or signature")
    if not signed_by_trusted_key(payload_b64, signature, keys):
        raise Refused(f"{path}: the signature does not verify with the app's public key (keyId {reply.get('keyId')})")
    payload = json.loads(base64.b64decode(payload_b64))
    if payload.get("nonce") != nonce:
        raise Refused(f"{path}: the nonce is not ours (a replayed answer?)")
    if not payload.get("expiresIn", 0) > time.time():
        raise Refused(f"{path}: the session has already expired")
    return payload


def check_online(s):
    nonce = secrets.token_hex(16)
    reply = post(
        s["base-url"],
        "/auth/validate",
        {"appId": s["app-id"], "appSecret": s["app-secret"], "licenseKey": s["license-key"], "hwid": s["hwid"], "nonce": nonce},
    )
    session = open_signed("/auth/validate", reply, s["keys"], nonce)
    if (session.get("appId"), session.get("licenseKey"), session.get("hwid")) != (s["app-id"], s["license-key"], s["hwid"]):
        raise Refused("/auth/validate: the signed payload is for another app, license or machine")
    seats = (
        "unlimited seats"
        if session["unlimitedHwidSlots"]
        else f"seat {session['hwidCount']} of {session['maxHwidSlots']}"
    )
    print(
        f"validate: ok, license {session['licenseKey']} (expires {session['licenseExpiresAt'] or 'never'}), {seats}, "
        f"session until {session['sessionExpiresAt']}, signed by {reply.get('keyId')}"
    )
    compact = lambda value: json.dumps(value, separators=(",", ":"))  # noqa: E731
    print(f"variables: app {compact(session['appVariables'])}, license {compact(session['licenseVariables'])}")

    heartbeat_nonce = secrets.token_hex(16)
    heartbeat = post(
        s["base-url"],
        "/auth/heartbeat",
        {"appId": s["app-id"], "sessionToken": session["sessionToken"], "hwid": s["hwid"], "nonce": heartbeat_nonce},
    )
    renewed = open_signed("/auth/heartbeat", heartbeat, s["keys"], heartbeat_nonce)
    print(f"heartbeat: ok, session until {renewed['sessionExpiresAt']}")


BASE64 = re.compile(r"^[A-Za-z0-9+/]+={0,2}$")


def parse_license_file(text):
    """The armored file's parts, or None. Tolerates CRLF, a BOM, re-wrapped lines and text around it."""
    lines = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n").split("\n")

    def find(marker, start):
        return next((i for i in range(start, len(lines)) if lines[i].strip() == marker), -1)

    begin = find("-----BEGIN AUTHFORGE LICENSE-----", 0)
    end = find("-----END AUTHFORGE LICENSE-----", begin + 1) if begin >= 0 else -1
    sig_begin = find("-----BEGIN AUTHFORGE SIGNATURE-----", end + 1) if end >= 0 else -1
    sig_end = find("-----END AUTHFORGE SIGNATURE-----", sig_begin + 1) if sig_begin >= 0 else -1
    if sig_end < 0:
        return None
    block = lines[begin + 1 : end]
    blank = next((i for i, line in enumerate(block) if line.strip() == ""), -1)
    if blank < 0 or any(line.find(":") <= 0 for line in block[:blank]):
        return None
    payload = re.sub(r"\s+", "", "".join(block[blank + 1 :]))
    signature = re.sub(r"\s+", "", "".join(lines[sig_begin + 1 : sig_end]))
    if not BASE64.match(payload) or not BASE64.match(signature):
        return None
    return payload, signature


def non_empty(value):
    return isinstance(value, str) and value != ""


def parse_iso(text):
    try:
        # fromisoformat reads a trailing Z only from Python 3.11 on.
        return datetime.fromisoformat(re.sub(r"[Zz]$", "+00:00", text))
    except ValueError:
        return None


def verify_license_file(text, app_id, keys, hwid, now=None):
    """The SDKs' verdict on a file, in their fixed order, and the payload when it is "ok"."""
    armor = parse_license_file(text)
    if armor is None:
        return "bad_armor", None
    payload_b64, signature = armor
    if not signed_by_trusted_key(payload_b64, signature, keys):
        return "bad_signature", None
    try:
        p = json.loads(base64.b64decode(payload_b64))
    except ValueError:
        return "malformed_payload", None
    if not isinstance(p, dict):
        return "malformed_payload", None
    # A JSON true is not the number 1, though Python's == says it is.
    if isinstance(p.get("v"), bool) or p.get("v") != 1:
        return "unsupported_version", None
    policy = p.get("hwid")
    policy_ok = isinstance(policy, dict) and (
        (policy.get("mode") == "bound" and isinstance(policy.get("hwids"), list) and policy["hwids"] and all(non_empty(h) for h in policy["hwids"]))
        or policy.get("mode") == "any"
    )
    shaped = (
        p.get("typ") == "authforge-license"
        and all(non_empty(p.get(field)) for field in ("appId", "licenseKey", "jti", "kid", "issuedAt"))
        and "expiresAt" in p
        and (p["expiresAt"] is None or non_empty(p["expiresAt"]))
        and policy_ok
    )
    if not shaped:
        return "malformed_payload", None
    if p["appId"] != app_id:
        return "wrong_app", None
    if p["expiresAt"] is not None:
        expires = parse_iso(p["expiresAt"])
        if expires is None or not expires > (now or datetime.now(timezone.utc)):
            return "expired", None
    if policy["mode"] == "bound" and hwid not in policy["hwids"]:
        return "hwid_mismatch", None
    return "ok", p


def check_offline(s):
    try:
        with open(s["offline-file"], encoding="utf-8") as handle:
            text = handle.read()
    except OSError as err:
        raise BadUsage(f"cannot read the offline file: {err}")
    code, p = verify_license_file(text, s["app-id"], s["keys"], s["hwid"])
    if code != "ok":
        raise Refused(f"offline file refused: {code}")
    machines = "any machine" if p["hwid"]["mode"] == "any" else f"this machine (1 of {len(p['hwid']['hwids'])} bound)"
    print(f"offline file: ok, license {p['licenseKey']}, file expires {p['expiresAt'] or 'never'}, valid on {machines}")


def main(argv):
    try:
        s, online, offline = read_settings(argv)
        if online:
            check_online(s)
        if offline:
            check_offline(s)
        print("license: good")
        return 0
    except Refused as err:
        print(f"license check failed: {err}", file=sys.stderr)
        return 1
    except BadUsage as err:
        print(f"license check failed: {err} (--help for usage)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
