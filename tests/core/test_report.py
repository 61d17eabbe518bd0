import json

import pytest

from jaxshare import AliasMap
from jaxshare.core.report import ArrayInfo, TieReport, format_bytes

STORED = {
    "params/wte/embedding": ArrayInfo((50257, 768), "bfloat16"),
    "params/ln/scale": ArrayInfo((768,), "float32"),
}
MAP = AliasMap(
    {"params/lm_head/kernel": "params/wte/embedding"}, transforms={"params/lm_head/kernel": (1, 0)}
)


def test_bytes_and_alias_shapes():
    r = TieReport("ckpt", "orbax", STORED, MAP)
    emb = 50257 * 768 * 2
    assert r.bytes_stored == emb + 768 * 4
    assert r.bytes_total == r.bytes_stored + emb
    assert r.bytes_saved == emb
    assert r.arrays["params/lm_head/kernel"] == ArrayInfo((768, 50257), "bfloat16")


def test_json():
    r = TieReport("ckpt", "orbax", STORED, MAP)
    doc = json.loads(r.to_json())
    assert doc["tie_groups"] == [
        {
            "canonical": "params/wte/embedding",
            "aliases": [
                {
                    "path": "params/lm_head/kernel",
                    "permute": [1, 0],
                    "written_out": False,
                    "origin": "alias map",
                }
            ],
            "origins": ["alias map"],
            "shape": [50257, 768],
            "dtype": "bfloat16",
            "bytes_each": 50257 * 768 * 2,
        }
    ]
    assert AliasMap.from_json(json.dumps(doc["alias_map"])) == MAP


def test_no_ties():
    r = TieReport("f.safetensors", "safetensors", STORED, AliasMap())
    assert r.bytes_saved == 0 and r.to_dict()["tie_groups"] == []


def test_canonical_missing_from_item_is_an_error():
    with pytest.raises(
        ValueError, match=r"ckpt: the alias map names canonical path\(s\) \['nope'\]"
    ):
        TieReport("ckpt", "orbax", STORED, AliasMap({"x": "nope"}))


@pytest.mark.parametrize(
    "dtype, size",
    [("float32", 4), ("bfloat16", 2), ("bool", 1), ("int64", 8), ("float8_e4m3fn", 1)],
)
def test_itemsizes(dtype, size):
    assert ArrayInfo((3,), dtype).nbytes == 3 * size


def test_format_bytes():
    assert format_bytes(1023) == "1023 B" and format_bytes(2**20) == "1.0 MiB"


def test_aliases_written_out_count_as_stored():
    r = TieReport(
        "m.safetensors",
        "safetensors",
        STORED,
        MAP,
        written_out=frozenset({"params/lm_head/kernel"}),
    )
    assert r.bytes_stored == r.bytes_total and r.bytes_saved == 0
    assert r.to_dict()["tie_groups"][0]["aliases"][0]["written_out"]
    with pytest.raises(ValueError, match=r"`written_out` names non-aliases \['params/ln/scale'\]"):
        TieReport("m", "safetensors", STORED, MAP, written_out=frozenset({"params/ln/scale"}))
