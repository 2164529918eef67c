"""What a capture tells strapd when it opens a session: the OPEN request, with the metadata
strapd copies into the stream header, and the fingerprint a resume is checked against."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from . import _distributed
from . import checkpoint as ckpt
from .config import InstrumentationConfig, TransportPlan
from ._anatomy import describe_model

if TYPE_CHECKING:  # pragma: no cover
    import torch.nn as nn


def transport(plan: TransportPlan) -> Dict[str, Any]:
    """The part of the transport plan a resume must keep (it shapes the stream's bytes).

    Args:
        plan: the config's transport plan.

    Returns:
        ``{"codec", "codec_level", "block_size"}``.
    """
    return {"codec": plan.codec, "codec_level": plan.codec_level, "block_size": plan.block_size}


def fingerprint(model: "nn.Module", config: InstrumentationConfig, plan: TransportPlan, modules: List[str]) -> str:
    """The capture's fingerprint (see :func:`llm_instrumentation.checkpoint.fingerprint`).

    Args:
        model: the model.
        config: its capture config.
        plan: the transport plan.
        modules: the hooked modules.

    Returns:
        ``"sha256:..."``.
    """
    # Resource events never change the stream: a resume may record them or not.
    # Nor does an upload target: the same capture may be resumed with or without one.
    cfg = {k: v for k, v in config.to_dict().items() if k not in ("resource_level", "upload")}
    return ckpt.fingerprint(model, cfg, transport(plan), list(modules))


def open_request(model: "nn.Module", config: InstrumentationConfig, plan: TransportPlan, modules: List[str],
                 output_path: str, fp: str, resume: Optional[ckpt.Checkpoint], upload: Optional[str] = None,
                 distributed: Optional[Dict[str, Any]] = None, upload_free_local: bool = False) -> Dict[str, Any]:
    """The OPEN request of a capture, for :func:`._session.open_session` (libstrap encodes it;
    the ring's size and the policy are the session's, the transport's ``ring_size`` the ring
    sent).

    Args:
        model: the model.
        config: its capture config.
        plan: the transport plan.
        modules: the hooked modules.
        output_path: the stream file (a label for strapd, which never opens it).
        fp: the capture's fingerprint.
        resume: the checkpoint a resumed capture continues, or None.
        upload: the s3:// target strapd uploads the stream into, or None.
        upload_free_local: ask strapd to free the uploaded bytes on the local disk while
            it captures (``serve --upload-free-local`` for this session).
        distributed: the ``distributed`` object of a rank of several (docs/DISTRIBUTED.md),
            or None (then detected here, without a layout).

    Returns:
        OPEN's fields, with ``metadata`` (a dict).
    """
    from ._version import __version__

    arch = describe_model(model)
    metadata = {
        "model_class": type(model).__name__,
        "model_family": arch["family"],
        "capture_config": config.to_dict(),
        "transport": {"codec": plan.codec, "codec_level": plan.codec_level, "block_size": plan.block_size,
                      "note": plan.note},
        "modules": list(modules),
        "output_path": output_path,
        "fingerprint": fp,
        "client": {"pid": os.getpid(), "argv0": os.path.basename(sys.argv[0]) if sys.argv else "",
                   "version": __version__},
    }
    if distributed is None:
        rank = _distributed.detect()
        distributed = rank.metadata() if rank is not None else None
    if distributed is not None:
        # Which rank of which job wrote the stream (docs/DISTRIBUTED.md), also when
        # STRAP_RANK_STREAMS=0 kept the path as given.
        metadata["distributed"] = distributed
    lossy = plan.lossy or {}
    return {"codec": plan.codec, "codec_level": plan.codec_level, "block_size": plan.block_size,
            "lossy_mode": lossy.get("mode"), "lossy_value": lossy.get("value"),
            "resume": (resume.stream_offset, resume.last_seq, resume.last_packet_crc, resume.packets)
            if resume is not None else None,
            "memory_hint": plan.memory_hint, "metadata": metadata, "upload": upload,
            "upload_free_local": upload_free_local}
