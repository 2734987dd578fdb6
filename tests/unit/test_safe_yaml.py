"""What a config file means does not depend on the PyYAML that pip picked.

PyYAML 6.0.4 changed two things under us: merge keys (``<<``) in a sequence let the *later*
mapping win (6.0.3 and the YAML merge-key rule: the earlier), and libyaml's own nesting bound
(1,000 levels, bundled since 6.0.4) refuses deep documents before our composer sees them,
with its own message. :mod:`adaptive_lb.config.safe_yaml` decides both itself. Every test
here runs on both of PyYAML's parsers (libyaml's, when this PyYAML has it, and PyYAML's own),
so a result that depended on one of them would show as a difference between the two; CI runs
them on the PyYAML of the constraints file and on the newest one.
"""

from __future__ import annotations

import pytest
import yaml

from adaptive_lb.config import ConfigError, parse_config, safe_yaml

PARSERS = ["pure-python"] + (["libyaml"] if safe_yaml._Parser is not None else [])


@pytest.fixture(params=PARSERS, autouse=True)
def parser(request, monkeypatch) -> str:
    """Each test once per parser PyYAML offers here."""
    if request.param == "pure-python":
        monkeypatch.setattr(safe_yaml, "_SafeLoader", safe_yaml._PurePythonLoader)
    return request.param


def sample_size(text: str) -> int:
    return parse_config(text).policy.sample_size


def error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "c.yaml")
    return str(info.value)


def test_of_mappings_merged_in_a_sequence_the_earlier_wins():
    """The YAML merge-key rule (yaml.org/type/merge.html): "keys in mapping nodes earlier in
    the sequence override keys specified in later mapping nodes". PyYAML 6.0.3 agrees (3);
    6.0.4 gives 4 (it keeps the first pair it copies, and copies from the end). We decide
    it ourselves, so it is 3 whichever PyYAML is installed."""
    assert sample_size("policy: {<<: [{sample_size: 3}, {sample_size: 4}]}\n") == 3
    three = "a: &a {sample_size: 3}\nb: &b {sample_size: 4}\npolicy: {<<: [*b, *a]}\n"
    with pytest.raises(ConfigError, match="a: unknown key"):
        parse_config(three)  # the anchors' own keys are not config keys...
    assert safe_yaml.parse_yaml(three, "s")[0]["policy"] == {"sample_size": 4}  # ...but *b won


def test_a_key_written_in_the_mapping_beats_a_merged_one_wherever_it_is():
    assert sample_size("policy: {<<: {sample_size: 3}, sample_size: 5}\n") == 5
    assert sample_size("policy: {sample_size: 5, <<: {sample_size: 3}}\n") == 5
    assert sample_size("policy: {sample_size: 5, <<: [{sample_size: 3}, {sample_size: 4}]}") == 5


def test_merges_nest_and_every_level_keeps_the_rule():
    text = (
        "defs:\n"
        "  - &base {sample_size: 3, token_aware: false, rack_penalty: 2.0}\n"
        "  - &mid {<<: *base, sample_size: 4}\n"
        "  - &top {<<: [{token_aware: true}, *mid]}\n"
        "policy: {<<: *top, rack_penalty: 3.0}\n"
    )
    data = safe_yaml.parse_yaml(text, "s")[0]
    assert data["policy"] == {
        "sample_size": 4,  # mid's own key beats base's
        "token_aware": True,  # the first of top's merged mappings beats mid (and base)
        "rack_penalty": 3.0,  # written in policy itself
    }
    assert data["defs"][1] == {"sample_size": 4, "token_aware": False, "rack_penalty": 2.0}


def test_two_merge_keys_in_one_mapping_are_a_duplicate_key():
    """PyYAML lets the last ``<<`` win up to 6.0.3 and the first since 6.0.4: refused."""
    message = error("policy:\n  <<: {sample_size: 3}\n  <<: {sample_size: 4}\n")
    assert "policy.<<: duplicate key (line 3, first on line 2)" in message


def test_a_mapping_merging_itself_adds_nothing():
    assert sample_size("policy: &p {sample_size: 3, <<: *p}\n") == 3


def test_only_mappings_can_be_merged():
    for text in ("a: &a 1\npolicy: {<<: *a}\n", "policy: {<<: [{sample_size: 3}, 4]}\n"):
        message = error(text)
        assert "expected a mapping or list of mappings for merging, but found scalar" in message
        assert message.startswith("c.yaml: line 2, column") or "line 1, column" in message


def _merge_bomb(levels: int) -> str:
    rows = ["a0: &a0 {x1: 1, x2: 2}"]
    rows += [f"a{i}: &a{i} {{<<: [*a{i - 1}, *a{i - 1}], y: 1}}" for i in range(1, levels + 1)]
    return "\n".join(rows) + "\n"


def test_merged_copies_are_counted_before_they_are_made():
    """Each level copies the one below twice: 14 levels would copy 98 K pairs, over the
    bound of 10,000 values. (PyYAML 6.0.4 happens to copy each key once; 6.0.3 copied them
    all, and 20 levels, 511 bytes, took 12 s. Our count does not depend on either.)"""
    assert "a0: unknown key" in error(_merge_bomb(10))
    assert error(_merge_bomb(14)) == (
        "c.yaml: line 12, column 12: merge keys (<<) make more than 10000 values: "
        "not a config file?"
    )


def test_deep_documents_get_our_message_and_our_position():
    """libyaml 0.2.6 (PyYAML 6.0.4's wheels) refuses 1,000 levels itself, scanning ahead:
    the message and the position are still ours, the first value past 16 levels."""
    for text, where in [
        ("[" * 5000, "line 1, column 17"),
        ("{a: " * 3000, "line 1, column 62"),
        ("policy:\n  local_rack: " + "[" * 2000, "line 2, column 29"),
    ]:
        assert error(text) == f"c.yaml: {where}: nested deeper than 16 levels", text[:40]


def test_libyaml_bound_is_recognised_where_libyaml_has_one(parser):
    """Pins the libyaml message we translate (:data:`~safe_yaml.LIBYAML_TOO_DEEP`) where
    this PyYAML's libyaml has the bound (PyYAML >= 6.0.4 wheels); older ones have none."""
    if parser != "libyaml":
        pytest.skip("PyYAML's own parser has no nesting bound of its own")
    levels = getattr(yaml._yaml, "_get_max_nest_level", lambda: -1)()
    if levels == -1:
        pytest.skip(f"PyYAML {yaml.__version__}'s libyaml has no nesting bound")
    with pytest.raises(yaml.YAMLError) as info:
        yaml.load("[" * (levels + 1), Loader=yaml.CSafeLoader)
    assert info.value.problem == safe_yaml.LIBYAML_TOO_DEEP
