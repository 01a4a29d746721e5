"""generate()'s settings in a MarianMT directory (generation_config.json, or config.json without
one) that make transformers choose other tokens than jaxformer's search does: each is refused at
import in one line naming the key and value, unless it has a value that changes nothing.

One is carried over instead (CARRIED_SETTINGS): renormalize_logits, which newer OPUS-MT files set
(e.g. opus-mt-en-jap). transformers then scores each step with the log-probabilities renormalized
over the tokens left after its bans (log_softmax again once bad_words_ids has removed pad), so its
beam scores, n-best lists and now and then its best hypothesis differ from those of log p under
the model. jaxformer's search does the same under DecodeSettings.renormalize_after_bans, which the
import sets in the run's config (decoding.renormalize_after_bans: validation, the final choice,
--checkpoint final's translate, evaluate and export, and --to_hf, which writes it back). A value
other than true, false or null is refused: transformers renormalizes only for true.

transformers' GenerationConfig keys that are not listed here change no token greedy or beam search
chooses (tests/interop/test_marian_checks.py holds every key of the installed GenerationConfig to
this): the search's own (num_beams, length_penalty, early_stopping, max_length, max_new_tokens,
num_return_sequences), which jaxformer-translate's flags choose (`search_flags`: those of the
model's default search, for convert's message; `recorded_search` keeps it in the run's config for
--to_hf, which writes it back: `exported_search`); sampling's (do_sample,
temperature, top_k, top_p, typical_p, min_p, top_h, epsilon_cutoff, eta_cutoff), which act only
when sampling; the token ids, checked by marian_files.marian_token_ids; and those of speed,
caching, compilation, lossless speculative decoding and what generate returns.

Under do_sample=true generate samples, and `search_flags` gives jaxformer's sampling flags
(--method sample --temperature --top_k, with transformers' default top_k of 50 where none is set).
What jaxformer's sampling cannot do (beam sampling, nucleus and the other cutoffs of
UNREPRODUCED_SAMPLING) cannot refuse the import, whose greedy and beam search stay exact: each is
named in one line of `unreproduced_sampling` for convert's message instead. So is a directory
whose bad_words_ids and suppress_tokens leave pad or the decoder start free (`unbanned_tokens`):
generate may output them, jaxformer's search never does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from jaxformer.decoding.generate import TEMPERATURE_RULE, DecodeSettings, is_valid_temperature
from jaxformer.interop.marian_layout import ConversionError


def _only_never_produced(value: Any, pad_id: int, _: int, start_id: int) -> bool:
    """None, or tokens jaxformer's search never produces: pad, and the decoder start (its BOS)."""
    return not value or (isinstance(value, list) and all(token in (pad_id, start_id) for token in value))


# generate()'s settings that change which tokens greedy and beam search choose, each with a test of
# the values that change nothing (jaxformer's search has none of them) and those values in words.
# Sampling's settings act only when sampling; num_beams, length_penalty, early_stopping and
# max_length are the search's own, which jaxformer-translate's flags choose.
GENERATION_SETTINGS: dict[str, tuple[Callable[[Any, int, int, int], bool], str]] = {
    "bad_words_ids": (
        lambda value, pad_id, _, start_id: (
            not value or (isinstance(value, list) and all(words in ([pad_id], [start_id]) for words in value))
        ),
        "none, [[pad_token_id]] or [[decoder_start_token_id]]: jaxformer's search never produces either",
    ),
    "suppress_tokens": (_only_never_produced, "none, the pad token or the decoder start token"),
    "begin_suppress_tokens": (_only_never_produced, "none, the pad token or the decoder start token"),
    "forced_bos_token_id": (lambda value, *_: value is None, "none"),
    "forced_eos_token_id": (
        lambda value, _, eos_id, __: value in (None, eos_id) or (isinstance(value, list) and set(value) == {eos_id}),
        "none, or eos_token_id: jaxformer ends a sequence cut at the length limit with EOS",
    ),
    "forced_decoder_ids": (lambda value, *_: not value, "none"),
    "sequence_bias": (lambda value, *_: not value, "none"),
    "no_repeat_ngram_size": (lambda value, *_: not value, "0"),
    "encoder_no_repeat_ngram_size": (lambda value, *_: not value, "0"),
    "repetition_penalty": (lambda value, *_: value in (None, 1), "1.0"),
    "encoder_repetition_penalty": (lambda value, *_: value in (None, 1), "1.0"),
    # The decoder start token counts towards min_length: 1 bans EOS nowhere.
    "min_length": (lambda value, *_: value in (None, 0, 1), "0 or 1"),
    "min_new_tokens": (lambda value, *_: not value, "0"),
    "exponential_decay_length_penalty": (lambda value, *_: value is None, "none"),
    "num_beam_groups": (lambda value, *_: value in (None, 1), "1"),
    "diversity_penalty": (lambda value, *_: not value, "0"),
    "penalty_alpha": (lambda value, *_: not value, "0"),  # contrastive search
    "dola_layers": (lambda value, *_: value is None, "none"),
    "guidance_scale": (lambda value, *_: value in (None, 1), "1"),  # classifier-free guidance
    "watermarking_config": (lambda value, *_: value is None, "none"),  # biases each step's tokens
    "force_words_ids": (lambda value, *_: not value, "none"),
    "constraints": (lambda value, *_: not value, "none"),
    "stop_strings": (lambda value, *_: not value, "none"),
    "token_healing": (lambda value, *_: not value, "false"),
    "max_time": (lambda value, *_: value is None, "none: where generate stops would depend on the machine's speed"),
    "assistant_ensemble_weight": (lambda value, *_: value is None, "none: speculative decoding stays lossless"),
}
# generate()'s settings that change how transformers scores, carried into the run's decoding
# settings (see the module docstring) instead of refused.
CARRIED_SETTINGS = ("renormalize_logits",)


def renormalizes(settings: Mapping[str, Any], where: str) -> bool:
    """Whether transformers' generate renormalizes each step's log-probabilities after its bans
    (`settings`' renormalize_logits, read from `where`); `ConversionError` for a value other than
    true, false or null, which transformers would take as false (it renormalizes for true alone)."""
    value = settings.get("renormalize_logits")
    if value is not None and not isinstance(value, bool):
        raise ConversionError(f"{where}: renormalize_logits={json.dumps(value)} is not a JSON boolean (true or false)")
    return bool(value)


# transformers' early_stopping values and jaxformer's beam stop rules (--stop) for the same rule.
EARLY_STOPPING_STOPS = ((False, "current_length"), (True, "beam_full"), ("never", "exact"))


# transformers' default top_k under do_sample where the generation config sets none
# (GenerationConfig._get_default_generation_params); jaxformer's --top_k defaults to 0, all tokens.
TRANSFORMERS_TOP_K = 50

# generate()'s sampling settings that jaxformer's sampling (--temperature, --top_k) has no
# equivalent of, each with a test of the values under which transformers adds no logits warper
# (GenerationMixin._get_logits_processor).
UNREPRODUCED_SAMPLING: dict[str, Callable[[Any], bool]] = {
    "top_p": lambda value: value is None or value >= 1.0,  # nucleus sampling
    "typical_p": lambda value: value is None or value >= 1.0,
    "min_p": lambda value: value is None,
    "top_h": lambda value: value is None,
    "epsilon_cutoff": lambda value: value is None or not 0.0 < value < 1.0,
    "eta_cutoff": lambda value: value is None or not 0.0 < value < 1.0,
}


def _setting(settings: Mapping[str, Any], key: str, default: Any) -> Any:
    """`settings`' value of `key`, generate()'s `default` where it is absent or null."""
    return settings.get(key) if settings.get(key) is not None else default


def samples(settings: Mapping[str, Any], where: str) -> bool:
    """Whether transformers' generate samples under `settings` (read from `where`): do_sample;
    `ConversionError` for a value other than true, false or null."""
    value = settings.get("do_sample")
    if value is not None and not isinstance(value, bool):
        raise ConversionError(f"{where}: do_sample={json.dumps(value)} is not a JSON boolean (true or false)")
    return bool(value)


def _sampling_flags(settings: Mapping[str, Any], vocab_size: int, where: str) -> tuple[str, ...]:
    """jaxformer-translate's sampling flags for generate()'s temperature and top_k (a top_k of
    `vocab_size`, the model's tokens, or more keeps them all, as jaxformer's --top_k 0 does)."""
    temperature, top_k = _setting(settings, "temperature", 1.0), _setting(settings, "top_k", TRANSFORMERS_TOP_K)
    if (
        not isinstance(temperature, (int, float))
        or isinstance(temperature, bool)
        or not is_valid_temperature(temperature)
    ):
        raise ConversionError(f"{where}: temperature={json.dumps(temperature)} is not {TEMPERATURE_RULE}")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
        raise ConversionError(f"{where}: top_k={json.dumps(top_k)} is not an integer >= 0")
    # str: the shortest text that reads back as the same float (":g" would round to 6 digits).
    return ("--method", "sample", "--temperature", str(temperature), "--top_k", str(top_k if top_k < vocab_size else 0))


def _beam_search(settings: Mapping[str, Any], where: str) -> tuple[int, float, str]:
    """(num_beams, length_penalty, jaxformer's --stop for early_stopping) of generate() under
    `settings` (read from `where`), with generate()'s defaults (1, 1.0, False); `ConversionError`
    for a value of a kind generate cannot search with."""
    beams, alpha, early_stopping = (
        _setting(settings, key, default)
        for key, default in (("num_beams", 1), ("length_penalty", 1.0), ("early_stopping", False))
    )
    if not isinstance(beams, int) or isinstance(beams, bool) or beams < 1:
        raise ConversionError(f"{where}: num_beams={json.dumps(beams)} is not a positive integer")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise ConversionError(f"{where}: length_penalty={json.dumps(alpha)} is not a number")
    stops = [
        stop for value, stop in EARLY_STOPPING_STOPS if type(value) is type(early_stopping) and value == early_stopping
    ]
    if not stops:
        raise ConversionError(f'{where}: early_stopping={json.dumps(early_stopping)} is not true, false or "never"')
    return beams, alpha, stops[0]


def search_flags(settings: Mapping[str, Any], where: str, vocab_size: int) -> tuple[str, ...]:
    """jaxformer-translate's flags for the search transformers' generate runs by default under
    `settings` (read from `where`) for a model of `vocab_size` tokens: sampling where do_sample is
    true (`_sampling_flags`), else greedy where num_beams is 1 (its default), else beam search of
    num_beams with |Y|^length_penalty (default 1.0) and early_stopping's stop rule (default False);
    scores renormalized where renormalize_logits is true. `ConversionError` for a value of a kind
    generate cannot search with."""
    beams, alpha, stop = _beam_search(settings, where)
    if samples(settings, where):
        flags = _sampling_flags(settings, vocab_size, where)
    elif beams == 1:
        flags = ("--method", "greedy")
    else:
        flags = ("--beam_size", str(beams), "--alpha", f"{alpha:g}", "--length_penalty", "transformers")
        flags += ("--stop", stop)
    return flags + (("--renormalize_after_bans", "true") if renormalizes(settings, where) else ())


def recorded_search(settings: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The `decoding` keys an import records for generate()'s default search under `settings`
    (read from `where`), so that --to_hf writes it back (`exported_search`): the method, and a beam
    search's beam_size, alpha and stop (its length_penalty, transformers', the import sets). The
    commands' defaults do not read them (jaxformer-translate's flags choose the search: `search_flags`)."""
    beams, alpha, stop = _beam_search(settings, where)
    if samples(settings, where):  # the decoding section keeps no temperature or top_k
        return {"method": "sample"}
    if beams == 1:
        return {"method": "greedy"}
    return {"method": "beam", "beam_size": beams, "alpha": float(alpha), "stop": stop}


def exported_search(decoding: Mapping[str, Any], alpha: float) -> tuple[dict[str, Any], str | None]:
    """(generate()'s settings, a warning or None) for a run's `decoding` section searched with
    `alpha` (final/'s chosen one, else decoding.alpha): a beam search's num_beams and the
    early_stopping of its stop rule, and its length_penalty where its form is transformers' |Y|^alpha.
    The gnmt form, ((5 + |Y|) / 6)^alpha, has no counterpart in generate: it keeps its default
    length_penalty (1.0), named in the warning; so are a beam of 1, which generate's num_beams makes
    greedy search, and sampling, whose temperature and top_k the section does not keep: generate
    then searches greedily, as with greedy search (no settings)."""
    method = decoding.get("method") or "beam"
    if method == "sample":
        return {}, (
            "the run samples (decoding.method=sample), and its config keeps no temperature or top_k: "
            "generation_config.json sets no sampling, so transformers' generate searches greedily"
        )
    if method != "beam":
        return {}, None
    beams = decoding.get("beam_size") or DecodeSettings.beam_size
    if beams == 1:  # GenerationConfig refuses to save early_stopping or length_penalty with num_beams 1
        return {}, (
            "the run's beam search keeps one hypothesis (decoding.beam_size=1), which transformers' generate "
            "cannot: generation_config.json sets no search, so generate searches greedily"
        )
    early_stopping = {stop: value for value, stop in EARLY_STOPPING_STOPS}[decoding.get("stop") or DecodeSettings.stop]
    search = {"num_beams": beams, "early_stopping": early_stopping}
    if decoding.get("length_penalty") == "transformers":
        return {**search, "length_penalty": float(alpha)}, None
    return search, (
        f"the run's length penalty, gnmt ((5 + |Y|) / 6)^{alpha:g} (decoding.length_penalty), has no counterpart in "
        f"transformers: generation_config.json sets num_beams {beams} with generate's default length_penalty, "
        "|Y|^1.0"
    )


def unreproduced_sampling(settings: Mapping[str, Any], where: str) -> tuple[str, ...]:
    """One line for each setting of generate()'s sampling under `settings` (read from `where`)
    that `search_flags`' sampling flags do not reproduce, naming its key and value; none where
    generate does not sample."""
    if not samples(settings, where):
        return ()
    lines = []
    beams = _setting(settings, "num_beams", 1)
    if beams != 1:
        lines.append(
            f"{where}: num_beams={json.dumps(beams)} with do_sample=true samples within a beam search, which "
            "jaxformer's search lacks: --method sample draws one sequence"
        )
    for key, unchanged in UNREPRODUCED_SAMPLING.items():
        value = settings.get(key)
        try:
            same = unchanged(value)
        except TypeError:  # a value of another type: transformers would not sample with it either
            same = False
        if not same:
            lines.append(
                f"{where}: {key}={json.dumps(value)} restricts transformers' sampling, and jaxformer's sampling "
                "has no such setting (only --temperature and --top_k): its samples follow another distribution"
            )
    return tuple(lines)


def unbanned_tokens(settings: Mapping[str, Any], pad_id: int, start_id: int, where: str) -> tuple[str, ...]:
    """One line naming the tokens jaxformer's search never produces (pad, the decoder start) that
    `settings` (read from `where`, checked by `check_generation_settings`) leave transformers'
    generate free to output, as a directory without OPUS-MT's bad_words_ids [[pad]] does, for
    convert's message; none where bad_words_ids or suppress_tokens ban them all."""
    banned = {words[0] for words in settings.get("bad_words_ids") or ()} | set(settings.get("suppress_tokens") or ())
    names = {start_id: "decoder_start_token_id", pad_id: "pad_token_id"}  # pad's name where they are one token
    unbanned = sorted(token for token in names if token not in banned)
    if not unbanned:
        return ()
    return (
        f"{where}: neither bad_words_ids nor suppress_tokens bans {' or '.join(f'{names[t]} {t}' for t in unbanned)}, "
        "which transformers' generate may then output and jaxformer's search never does, so their translations "
        f"and scores can differ (bad_words_ids={json.dumps([[token] for token in sorted(names)])} makes them agree)",
    )


def check_generation_settings(settings: Mapping[str, Any], pad_id: int, eos_id: int, start_id: int, where: str) -> None:
    """`ConversionError` naming the key and value where `settings` (read from `where`, the file
    transformers' generate takes them from) would make transformers decode otherwise than
    jaxformer (GENERATION_SETTINGS)."""
    for key, (unchanged, accepted) in GENERATION_SETTINGS.items():
        value = settings.get(key)
        try:
            same = unchanged(value, pad_id, eos_id, start_id)
        except TypeError:  # a value of another type (a dict where a list belongs): not one that changes nothing
            same = False
        if not same:
            raise ConversionError(
                f"{where}: {key}={value!r} changes what transformers generates, and jaxformer's search has no such "
                f"setting (accepted: {accepted})"
            )
