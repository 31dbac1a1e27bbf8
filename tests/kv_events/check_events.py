#!/usr/bin/python3
"""Subscribes to a kvserve KV-event publisher as a vLLM subscriber would and
checks every batch against vLLM's schema (vllm/distributed/kv_events.py:
msgspec structs with array_like=True, tag=True), field by field in vLLM's
order. Prints "ready" once subscribed, then one JSON summary line.

Gap: live batches whose sequence is in --drop are ignored as if lost; the
next live batch shows the gap and the missing ones are asked for on the
replay socket (a DEALER: vLLM's ROUTER answers one request with several
messages, which a REQ socket would refuse after the first).
"""
import argparse
import json
import sys
import time

import msgpack
import zmq


def check_hash(h, where):
    if not isinstance(h, int) or not (0 <= h < 2**64):
        raise ValueError(f"{where}: block hash {h!r} is not an unsigned 64-bit integer")


def check_batch(obj, tokens, block_size):
    """EventBatch: [ts: float, events: list, data_parallel_rank: int | None]."""
    if not isinstance(obj, list) or len(obj) not in (2, 3):
        raise ValueError(f"batch is not [ts, events, dp_rank?]: {obj!r}")
    ts, events = obj[0], obj[1]
    if not isinstance(ts, float):
        raise ValueError("ts is not a float")
    if len(obj) == 3 and obj[2] is not None and not isinstance(obj[2], int):
        raise ValueError("data_parallel_rank is not an int")
    if not isinstance(events, list):
        raise ValueError("events is not a list")
    out = []
    for ev in events:
        if not isinstance(ev, list) or not ev or not isinstance(ev[0], str):
            raise ValueError(f"event is not a tagged array: {ev!r}")
        tag = ev[0]
        if tag == "BlockStored":
            # block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium
            if len(ev) != 7:
                raise ValueError(f"BlockStored has {len(ev) - 1} fields, want 6")
            hashes, parent, token_ids, bs, lora_id, medium = ev[1:]
            if not isinstance(hashes, list) or not hashes:
                raise ValueError("BlockStored.block_hashes is not a non-empty list")
            for h in hashes:
                check_hash(h, "BlockStored.block_hashes")
            if parent is not None:
                check_hash(parent, "BlockStored.parent_block_hash")
            if not isinstance(token_ids, list) or not all(isinstance(t, int) for t in token_ids):
                raise ValueError("BlockStored.token_ids is not a list of ints")
            if bs != block_size:
                raise ValueError(f"BlockStored.block_size {bs!r}, want {block_size}")
            want = len(hashes) * block_size if tokens else 0
            if len(token_ids) != want:
                raise ValueError(f"BlockStored.token_ids has {len(token_ids)} ids, want {want}")
            if lora_id is not None and not isinstance(lora_id, int):
                raise ValueError("BlockStored.lora_id is not int | None")
            if medium is not None and not isinstance(medium, str):
                raise ValueError("BlockStored.medium is not str | None")
            out.append(("stored", hashes, parent))
        elif tag == "BlockRemoved":
            if len(ev) != 3:
                raise ValueError(f"BlockRemoved has {len(ev) - 1} fields, want 2")
            hashes, medium = ev[1:]
            if not isinstance(hashes, list) or not hashes:
                raise ValueError("BlockRemoved.block_hashes is not a non-empty list")
            for h in hashes:
                check_hash(h, "BlockRemoved.block_hashes")
            if medium is not None and not isinstance(medium, str):
                raise ValueError("BlockRemoved.medium is not str | None")
            out.append(("removed", hashes, None))
        elif tag == "AllBlocksCleared":
            if len(ev) != 1:
                raise ValueError("AllBlocksCleared has fields")
            out.append(("cleared", [], None))
        else:
            raise ValueError(f"unknown event tag {tag!r}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pub", required=True)
    ap.add_argument("--replay", required=True)
    ap.add_argument("--topic", default="")
    ap.add_argument("--block-size", type=int, required=True)
    ap.add_argument("--tokens", action="store_true")
    ap.add_argument("--drop", default="", help="comma-separated live sequences to ignore")
    ap.add_argument("--until-seq", type=int, default=-1, help="stop after this sequence was handled")
    ap.add_argument("--expect-stored", type=int, default=0, help="stop after this many stored blocks")
    ap.add_argument("--idle", type=float, default=0, help="stop after this long without a message (once one came)")
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--curve-server-key", default="")
    a = ap.parse_args()
    drop = {int(x) for x in a.drop.split(",") if x}

    ctx = zmq.Context()
    sub, req = ctx.socket(zmq.SUB), ctx.socket(zmq.DEALER)
    for s in (sub, req):
        if a.curve_server_key:
            pub_key, sec_key = zmq.curve_keypair()
            s.curve_publickey, s.curve_secretkey = pub_key, sec_key
            s.curve_serverkey = a.curve_server_key.encode()
        s.setsockopt(zmq.LINGER, 0)
    sub.setsockopt_string(zmq.SUBSCRIBE, a.topic)
    sub.connect(a.pub)
    req.connect(a.replay)
    time.sleep(0.5)  # PUB/SUB: let the subscription reach the publisher
    print("ready", flush=True)

    handled, summary = {}, {"errors": [], "replayed": 0, "replay_end": 0, "gaps": 0}

    def handle(seq, payload, replayed):
        try:
            handled[seq] = check_batch(msgpack.unpackb(payload, raw=False, strict_map_key=False),
                                       a.tokens, a.block_size)
            summary["replayed"] += replayed
        except Exception as e:  # noqa: BLE001 - reported in the summary
            summary["errors"].append(f"seq {seq}: {e}")

    def replay_from(start, stop):
        req.send_multipart([b"", start.to_bytes(8, "big")])  # the envelope a REQ socket would add
        while req.poll(5000):
            frames = req.recv_multipart()
            if len(frames) != 3 or frames[0] != b"":
                summary["errors"].append(f"replay reply with {len(frames)} frames")
                return
            _, seq_bytes, payload = frames
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            if seq == -1:
                summary["replay_end"] += 1 if payload == b"" else 0
                return
            if start <= seq < stop and seq not in handled:
                handle(seq, payload, 1)
        summary["errors"].append("replay did not end with the -1 marker")

    def stored_blocks():
        return sum(len(h) for evs in handled.values() for k, h, _ in evs if k == "stored")

    last = None
    deadline = time.time() + a.timeout
    last_msg = None
    while time.time() < deadline:
        if a.idle and last_msg is not None and time.time() - last_msg > a.idle:
            break
        if a.until_seq >= 0 and a.until_seq in handled:
            break
        if a.expect_stored and stored_blocks() >= a.expect_stored:
            break
        if not sub.poll(100):
            continue
        frames = sub.recv_multipart()
        last_msg = time.time()
        if len(frames) != 3 or len(frames[1]) != 8:
            summary["errors"].append(f"message with {len(frames)} frames")
            continue
        topic, seq_bytes, payload = frames
        seq = int.from_bytes(seq_bytes, "big")
        if topic.decode() != a.topic:
            summary["errors"].append(f"topic {topic!r}")
        if seq in drop:
            continue
        first_missing = 0 if last is None else last + 1
        if seq > first_missing:
            summary["gaps"] += 1
            replay_from(first_missing, seq)
        handle(seq, payload, 0)
        last = seq

    kinds = [k for evs in handled.values() for k, _, _ in evs]
    stored = [h for evs in handled.values() for k, hs, _ in evs if k == "stored" for h in hs]
    parents_known = all(p is None or p in set(stored)
                        for evs in handled.values() for k, _, p in evs if k == "stored")
    summary.update({"seqs": sorted(handled), "stored_blocks": len(stored), "stored_hashes": stored,
                    "removed_blocks": sum(len(h) for evs in handled.values() for k, h, _ in evs if k == "removed"),
                    "cleared": kinds.count("cleared"), "parents_known": parents_known})
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    sys.exit(main())
