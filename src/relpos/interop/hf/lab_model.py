"""A transformers causal LM behind the interface relpos's lab uses (``relpos longctx``).

``HFCausalLM(model, tokenizer)`` gives a transformers model ``LlamaLM``'s lab surface:
``set_encoding(name, **options)`` (un)patches the model (``relpos.interop.hf.patch``), and
``token_nll`` / ``generate`` run the transformers model itself: its decoder, its LM head and
its KV cache (``DynamicCache``), greedy decoding. ``set_encoding("rope", ...)`` runs relpos's
RoPE (float64 angle products) instead of the model's, so ``relpos longctx --model hf:...``
measures the same functions as the built-in ``LlamaLM``.

``load_hf(spec) -> (HFCausalLM, tokenizer)`` for ``--model hf:<spec>``:

* ``smollm2``: the bundled SmolLM2 GGUF file, read by transformers' own GGUF loader;
* a ``.gguf`` file: the same, for another Llama-family file;
* a folder: ``from_pretrained(folder)`` (local files only) and its tokenizer (None when the
  folder has none);
* a ``.json`` config: a model built from it with random weights (``torch.manual_seed(0)``)
  and no tokenizer (smoke tests, training from scratch).

GGUF models use the file's own tokenizer as relpos builds it (``interop.gguf.build_tokenizer``),
so both models read the same token ids. ``hf_config(spec)`` reads the config only (the lab's
length and memory checks run before anything is loaded).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...nn.llama import HEAD_CHUNK
from ...validation import check_int
from .patch import BASELINE, PatchHandle, _transformers, patch

__all__ = ["HFSummary", "HFCausalLM", "load_hf", "hf_config", "parse_hf_spec", "PREFIX"]

PREFIX = "hf:"


@dataclass(frozen=True)
class HFSummary:
    """The sizes the lab prints and checks (``LlamaConfig``'s field names)."""

    name: str
    vocab_size: int
    dim: int
    depth: int
    num_heads: int
    num_kv_heads: int
    hidden_dim: int
    max_position_embeddings: int
    head_dim: int

    @classmethod
    def of(cls, config: Any, name: str) -> HFSummary:
        heads = config.num_attention_heads
        return cls(
            name=name,
            vocab_size=int(config.vocab_size),
            dim=int(config.hidden_size),
            depth=int(config.num_hidden_layers),
            num_heads=int(heads),
            num_kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            hidden_dim=int(getattr(config, "intermediate_size", 4 * config.hidden_size)),
            max_position_embeddings=int(getattr(config, "max_position_embeddings", 2048)),
            head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // heads),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class HFCausalLM(nn.Module):
    """A transformers causal LM with ``LlamaLM``'s lab interface (module docstring).

    Args:
        model: a transformers causal LM (``patch`` must accept it).
        name: what the lab prints as the model's name.
    """

    def __init__(self, model: nn.Module, name: str = "") -> None:
        super().__init__()
        self.model = model.eval()
        self.config = HFSummary.of(model.config, name or getattr(model.config, "model_type", ""))
        self.encoding_name = BASELINE
        self.encoding_options: dict[str, Any] = {}
        self.handle: PatchHandle | None = None
        self.set_encoding(BASELINE)

    # ------------------------------------------------------------------ the encoding
    def set_encoding(self, encoding: str, **options: Any) -> PatchHandle:
        """Patch the model with ``encoding`` (a relpos encoding name or ``"baseline"``: the
        model's own RoPE); the previous patch is undone first."""
        if self.handle is not None:
            self.handle.unpatch()
            self.handle = None
        self.handle = patch(self.model, encoding, **options)
        self.encoding_name, self.encoding_options = encoding, dict(options)
        return self.handle

    # ------------------------------------------------------------------ forward
    def _check_tokens(self, tokens: Tensor) -> None:
        from ...validation import check_token_ids

        check_token_ids(tokens, self.config.vocab_size)

    def head(self, h: Tensor) -> Tensor:
        """Logits of hidden states, as the model's own forward computes them (its LM head,
        and a final logit softcap where the config has one)."""
        logits = self.model.get_output_embeddings()(h)
        cap = getattr(self.model.config, "final_logit_softcapping", None)
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def forward(self, tokens: Tensor, *, last: int | None = None) -> Tensor:
        """Logits ``(B, L, vocab)``, or of the last ``last`` positions."""
        self._check_tokens(tokens)
        return self.model(tokens, logits_to_keep=last or 0).logits

    @torch.no_grad()
    def token_nll(self, tokens: Tensor, *, start: int = 0, chunk: int = HEAD_CHUNK) -> Tensor:
        """``LlamaLM.token_nll``: the NLL of each next token from ``start`` ``(B, L - 1 -
        start)``, one decoder pass, the LM head over at most ``chunk`` positions at a time."""
        self._check_tokens(tokens)
        L = tokens.shape[1]
        if L < 2:
            raise ValueError(f"tokens must hold at least 2 positions to score, got {L}")
        check_int(start, "start", minimum=0, maximum=L - 2)
        check_int(chunk, "chunk")
        decoder = self.model.get_decoder()
        h = decoder(input_ids=tokens[:, :-1], use_cache=False).last_hidden_state[:, start:]
        targets = tokens[:, start + 1 :]
        out = []
        for a in range(0, h.shape[1], chunk):
            logits = self.head(h[:, a : a + chunk]).float()
            nll = F.cross_entropy(
                logits.flatten(0, 1), targets[:, a : a + chunk].flatten(), reduction="none"
            )
            out.append(nll.view(targets.shape[0], -1))
        return torch.cat(out, dim=1)

    @torch.no_grad()
    def generate(
        self,
        tokens: Tensor,
        max_new_tokens: int,
        *,
        eos_token_id: int | None = None,
        stop: Callable[[Tensor], bool] | None = None,
    ) -> Tensor:
        """``LlamaLM.generate`` on the transformers model: greedy decoding with its KV cache
        (only the last position's logits each step); stops on ``eos_token_id`` in every row or
        when ``stop(new_tokens)`` is true."""
        self._check_tokens(tokens)
        check_int(max_new_tokens, "max_new_tokens", minimum=0)
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        out = self.model(tokens, cache=cache, use_cache=True, logits_to_keep=1)
        new: list[Tensor] = []
        done = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
        for step in range(max_new_tokens):
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            new.append(nxt)
            if eos_token_id is not None:
                done |= nxt[:, 0] == eos_token_id
                if bool(done.all()):
                    break
            if stop is not None and stop(torch.cat(new, dim=1)):
                break
            if step + 1 < max_new_tokens:
                out = self.model(nxt, cache=cache, use_cache=True, logits_to_keep=1)
        return torch.cat([tokens, *new], dim=1)

    def extra_repr(self) -> str:
        return f"{self.config.name!r}, encoding={self.encoding_name!r}"


# ------------------------------------------------------------------------------ loading


def parse_hf_spec(name: str) -> str:
    """The part after ``hf:``; ``ValueError`` naming ``--model`` for an empty or missing one."""
    spec = name[len(PREFIX) :] if name.startswith(PREFIX) else name
    if spec == "smollm2":
        return spec
    path = Path(spec)
    if not spec or not path.exists():
        raise ValueError(
            f"--model hf:<spec> takes smollm2, a transformers model folder, a config .json or "
            f"a .gguf file; {spec!r} does not exist"
        )
    if path.is_file() and path.suffix not in (".json", ".gguf"):
        raise ValueError(f"--model hf:{spec}: a file must be a config .json or a .gguf file")
    return spec


def _gguf_path(spec: str) -> Path | None:
    from ..gguf import smollm2_path

    if spec == "smollm2":
        return smollm2_path()
    return Path(spec) if spec.endswith(".gguf") else None


def _config_from_json(path: Path) -> Any:
    from transformers import AutoConfig

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"--model hf:{path}: not a readable JSON config ({err})") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise ValueError(f"--model hf:{path}: the config has no 'model_type'")
    data = dict(data)
    try:
        return AutoConfig.for_model(data.pop("model_type"), **data)
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"--model hf:{path}: {err}") from None


def hf_config(spec: str) -> HFSummary:
    """The ``HFSummary`` of ``--model hf:<spec>`` without loading weights."""
    _transformers()
    spec = parse_hf_spec(spec)
    gguf = _gguf_path(spec)
    if gguf is not None:
        from ..gguf import llama_config, open_gguf, read_metadata

        reader = open_gguf(gguf)
        shapes = {t.name: [int(n) for n in t.shape.tolist()] for t in reader.tensors}
        c = llama_config(
            read_metadata(reader),
            vocab_size=shapes.get("token_embd.weight", [None])[-1],
            tie_embeddings="output.weight" not in shapes,
        )
        return HFSummary(
            name=c.name or spec,
            vocab_size=c.vocab_size,
            dim=c.dim,
            depth=c.depth,
            num_heads=c.num_heads,
            num_kv_heads=c.num_kv_heads,
            hidden_dim=c.hidden_dim,
            max_position_embeddings=c.max_position_embeddings,
            head_dim=c.head_dim,
        )
    path = Path(spec)
    if path.is_file():
        return HFSummary.of(_config_from_json(path), path.stem)
    from transformers import AutoConfig

    return HFSummary.of(AutoConfig.from_pretrained(spec, local_files_only=True), path.name)


def load_hf(spec: str, *, seed: int = 0) -> tuple[HFCausalLM, Any]:
    """``(HFCausalLM, tokenizer)`` of ``--model hf:<spec>`` (module docstring); the tokenizer
    is None for a config, or a folder without one (the lab then reads UTF-8 bytes)."""
    _transformers()
    from transformers import AutoModelForCausalLM

    spec = parse_hf_spec(spec)
    gguf = _gguf_path(spec)
    if gguf is not None:
        from ..gguf import build_tokenizer, open_gguf

        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        tokenizer = build_tokenizer(open_gguf(gguf))
        return HFCausalLM(model, f"{gguf.stem} (transformers)"), tokenizer
    path = Path(spec)
    if path.is_file():
        config = _config_from_json(path)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
        name = f"{path.stem} (random weights, seed {seed})"
        tokenizer = None
    else:
        model = AutoModelForCausalLM.from_pretrained(spec, local_files_only=True)
        name = path.name
        tokenizer = _folder_tokenizer(path)
    return HFCausalLM(model.float(), name), tokenizer


def _folder_tokenizer(path: Path) -> Any:
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
