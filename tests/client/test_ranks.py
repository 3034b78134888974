"""Rank and world size from arguments or the environment."""

from __future__ import annotations

import json

import pytest

from adaptd.client.agreement.ranks import resolve

TF_CONFIG = json.dumps(
    {
        "cluster": {"chief": ["h0:1"], "worker": ["h1:1", "h2:1", "h3:1"]},
        "task": {"type": "worker", "index": 1},
    }
)


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ((None, None), {}, (0, 1)),
        ((2, 4), {"RANK": "1", "WORLD_SIZE": "8"}, (2, 4)),  # arguments win
        ((None, None), {"RANK": "3", "WORLD_SIZE": "8"}, (3, 8)),
        ((None, None), {"TF_CONFIG": TF_CONFIG}, (2, 4)),  # worker 1 after the chief
        ((None, None), {"TF_CONFIG": TF_CONFIG, "RANK": "0"}, (0, 4)),
    ],
)
def test_resolve(args, env, expected):
    assert resolve(*args, environ=env) == expected


@pytest.mark.parametrize(
    ("args", "env", "match"),
    [
        ((None, None), {"RANK": "x"}, "RANK='x'"),
        ((-1, None), {}, "rank must be"),
        ((0, 0), {}, "world_size must be"),
        ((4, 4), {}, "rank 4 is not below world_size 4"),
        ((None, None), {"TF_CONFIG": "{not json"}, "TF_CONFIG"),
    ],
)
def test_resolve_errors_name_the_culprit(args, env, match):
    with pytest.raises(ValueError, match=match):
        resolve(*args, environ=env)
