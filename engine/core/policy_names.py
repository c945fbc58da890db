"""How scheduling policies are named: the shipped ones, and ``package.module:ClassName``.

A leaf module (no imports of ours), so the configs can check a name without importing the
policies; ``policy.py`` resolves names to classes.
"""

from __future__ import annotations

import re

#: The policies shipped with twinserve, by name (vLLM's two, and ``engine/policies/``).
SHIPPED: dict[str, str] = {
    "fcfs": "engine.core.policy:VllmPolicy",
    "priority": "engine.core.policy:VllmPolicy",
    "sjf": "engine.policies.sjf:ShortestJobFirst",
    "srpt": "engine.policies.sjf:ShortestRemainingFirst",
    "edf": "engine.policies.edf:EarliestDeadlineFirst",
    "vtc": "engine.policies.fair_share:VirtualTokenCounter",
    "decode-first": "engine.policies.sarathi:DecodeFirst",
    "prefill-first": "engine.policies.sarathi:PrefillFirst",
    "shed": "engine.policies.shedding:LoadShedding",
}

#: ``package.module:ClassName``
_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


def check_policy_name(name: object) -> str | None:
    """Why ``name`` cannot name a policy (None: it can): a shipped name or a
    ``package.module:ClassName`` path (only the spelling is checked here)."""
    if isinstance(name, str) and (name in SHIPPED or _PATH.match(name)):
        return None
    return (
        f"unknown scheduling policy {name!r}; valid: {', '.join(SHIPPED)}, or "
        "package.module:ClassName for a policy class of your own"
    )
