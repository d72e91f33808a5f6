"""`python -m ensembles keys {new,hash}`: mint API keys for tenants (or the trusted front's credential) and print
the line the limits file stores (docs/rate_limiting.md, "Tenants and API keys").

    python -m ensembles keys new --tenant acme     # a key for acme, and its [tenants.acme] api_key_sha256 line
    python -m ensembles keys new --front           # the trusted front's credential, [global] line
    python -m ensembles keys hash < key.txt        # the digest of an existing key (read from stdin)

The key is printed once, on stdout, and stored nowhere: hand it to the tenant. The limits file keeps its SHA-256.
To rotate, append the new digest to the list, hand out the new key, then drop the old digest.
"""
from __future__ import annotations

import argparse
import sys

from backend.policy.api_keys import key_hash, new_key
from backend.policy.tenants import check_tenant_id


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ensembles keys", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    new = sub.add_parser("new", help="mint a key; print it and the limits-file line with its hash")
    who = new.add_mutually_exclusive_group(required=True)
    who.add_argument("--tenant", help="the tenant id the key authenticates")
    who.add_argument("--front", action="store_true", help="the trusted front's credential")
    sub.add_parser("hash", help="print the SHA-256 digest of a key read from stdin")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.command == "hash":
        key = sys.stdin.readline().strip()
        if not key:
            print("error: no key on stdin", file=sys.stderr)
            return 2
        print(key_hash(key))
        return 0
    if args.tenant is not None:
        try:
            check_tenant_id(args.tenant)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    key = new_key()
    if args.front:
        print(f"trusted front credential (send as header x-tritonllm-front-key; shown once): {key}")
        print("[global]")
        print(f'trusted_front_key_sha256 = ["{key_hash(key)}"]')
    else:
        print(f"API key for tenant {args.tenant} (send as 'authorization: Bearer <key>'; shown once): {key}")
        print(f"[tenants.{args.tenant}]")
        print(f'api_key_sha256 = ["{key_hash(key)}"]')
    return 0
