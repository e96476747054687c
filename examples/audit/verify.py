#!/usr/bin/env python3
"""Check an Agora audit export (docs/audit.md): python3 verify.py EXPORT.jsonl
Exit 0 when every hash and link holds; 1 naming the first bad entry."""
import hashlib, json, sys

def canonical(obj):  # the documented encoding: sorted keys, no spaces, UTF-8
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

def verify(path):
    complete, prev, count = True, None, 0
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            e = json.loads(line)
            if n == 1 and "agora_audit_export" in e:  # the header: whole log or a selection
                complete = e.get("complete") is True
                continue
            bad = lambda why: sys.exit("line %d, entry seq %s: %s" % (n, e.get("seq"), why))
            if hashlib.sha256(canonical({k: v for k, v in e.items() if k != "hash"})).hexdigest() != e.get("hash"):
                bad("altered: its content does not match its hash")
            if prev is None:
                if complete and (e["seq"] != 1 or e["prev_hash"] != "0" * 64):
                    bad("removed: the log does not start at seq 1 from the genesis hash")
            elif e["seq"] == prev["seq"] + 1:
                if e["prev_hash"] != prev["hash"]:
                    bad("its prev_hash is not the hash of seq %d: one was rewritten or inserted" % prev["seq"])
            elif e["seq"] <= prev["seq"]:
                bad("reordered or inserted: it follows seq %d" % prev["seq"])
            elif complete:
                bad("entries %d to %d removed (or moved)" % (prev["seq"] + 1, e["seq"] - 1))
            if e["kind"] == "checkpoint" and (e.get("head_hash") != e["prev_hash"] or e.get("count") != e["seq"] - 1):
                bad("altered: the checkpoint does not match the chain")
            prev, count = e, count + 1
    if prev is None:
        sys.exit("no entries")
    kind = "complete" if complete else "filtered (links checked where seqs are contiguous)"
    print("ok: %s export, %d entries, head seq %d hash %s" % (kind, count, prev["seq"], prev["hash"]))

if __name__ == "__main__":
    verify(sys.argv[1])
