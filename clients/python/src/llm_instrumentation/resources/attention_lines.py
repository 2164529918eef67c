"""The writer's lines of the attention's records: the attention event, its output
allocation and the layer's KV-cache event (see ``lines.py``)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from .caches import kv_len_of
from .events import MIB, Meta, attention_flops, attention_tokens, dname, itemsize, kv_figures, meta, per_us
from .lines import Lines, Out, timing_us
from .sites import Site
from .templates import ENCODER, KV_SLOTS, TIMED_SLOTS, compile_template, positional, program, shape_info

__all__ = ["AttentionLines"]


class AttentionLines(Lines):
    """:class:`Lines` and the attention's: every record kind's lines."""

    def attention_raw(self, site: Site, end: int, timing: Any, in_shape: Any, in_dtype: Any, in_cuda: bool,
                      out_shape: Any, out_dtype: Any,
                      out_cuda: bool, query_tokens: int, key_tokens: int, kv: Any, flops: Optional[int]) -> Out:
        """An attention record of the general wrapper (shapes and dtypes as read, end time on
        ``perf_counter_ns``)."""
        st = self.state
        if type(timing) is int and timing > st.long_ns:
            st.long_ns, st.long_site = timing, site
        km = vm = None
        if kv is not None:
            km = meta(kv[0], kv[1], kv[2])
            vm = meta(kv[3], kv[4], kv[5])
        xm, om = meta(in_shape, in_dtype, in_cuda), meta(out_shape, out_dtype, out_cuda)
        tns = end + st.clock_offset
        if not self.fast:
            return self.attention(site, tns, timing, xm, om, query_tokens, key_tokens, km, vm, flops)
        if flops is not None:
            st.pass_flops += flops
        ctx = (site, tns // 1000, st.step, st.forward)
        cuda = type(timing) is not int  # a CUDA event pair: templated as well, by the µs it measured
        timing, d = timing_us(timing, True)
        if d is None:
            return self.build.attention(ctx, timing, xm, om, query_tokens, key_tokens, km, vm, flops)
        # The cache's shapes, the key length and the FLOPs change every decoding step: they
        # are slots of the template, not part of its key.
        variant = 0 if flops is None else 2 if flops and d > 0 else 1
        key = ("attention", site, in_shape, in_dtype, in_cuda, out_shape, out_dtype, out_cuda,
               kv[1] if kv is not None else None, kv[4] if kv is not None and kv[3] is not None else None, variant,
               cuda)  # records.KEYS[ATTENTION]
        tpl = st.templates.get(key)
        if tpl is None:
            ev = self.template_of(self.build.attention, ctx, timing, xm, om, query_tokens, key_tokens, km, vm,
                                  flops)[0]
            slots = dict(TIMED_SLOTS, query_tokens="qt", key_tokens="kt")
            if km is not None:
                slots["input_tensors"] = "it"
            if flops is not None:
                slots.update(flops="fl", compute_intensity_gflops="gf")
            fmt = compile_template(ev, "seq", slots)
            if km is not None:
                fmt = fmt.replace("%(it)s", _cache_inputs(ev, km[1], vm[1] if vm is not None else None))
            # records.ENTRIES[ATTENTION]
            tpl = st.templates[key] = (fmt, program(fmt))
        fmt = tpl[0]
        st.seq = seq = st.seq + 1
        v: Dict[str, Any] = {"ts": ctx[1], "seq": seq, "step": ctx[2], "fwd": ctx[3], "d": d, "qt": query_tokens,
                             "kt": key_tokens}
        if km is not None:
            v["ks"] = shape_info(km[0])[0]
            v["vs"] = shape_info(vm[0])[0] if vm is not None else "null"
        if flops is not None:
            v["fl"] = flops
            v["gf"] = flops / 1e9
            if variant == 2:
                v["tf"] = per_us(flops, d)
            if flops:
                st.total_flops += flops
        self._count("compute_execution")
        return [(fmt % v).encode()]

    def kv_raw(self, site: Site, end: int, layer_index: int, kv: Any, length_before: int) -> Out:
        km = meta(kv[0], kv[1], kv[2])
        assert km is not None
        return self.kv(site, end + self.state.clock_offset, layer_index, km, meta(kv[3], kv[4], kv[5]), length_before)

    def attention(self, site: Site, tns: int, timing: Any, xm: Optional[Meta], om: Optional[Meta], q_len: int,
                  kv_len: int, km: Optional[Meta], vm: Optional[Meta], flops: Optional[int]) -> Out:
        """An attention event as the builders make it (the writer's way without its fast paths)."""
        st = self.state
        if flops is not None:
            st.pass_flops += flops
        ctx = (site, tns // 1000, st.step, st.forward)
        return self.build.attention(ctx, timing, xm, om, q_len, kv_len, km, vm, flops)

    def kv(self, site: Site, tns: int, idx: int, km: Meta, vm: Optional[Meta], before: int) -> Out:
        st = self.state
        ctx = (site, tns // 1000, st.step, st.forward)
        if not self.fast:
            return self.build.kv(ctx, idx, km, vm, before)
        key = ("kv", site, km[1], km[3], (len(km[0]) >= 2) + 2 * (vm is None))  # records.KEYS[KV]
        tpl = st.templates.get(key)
        if tpl is None:
            fmt = compile_template(self._kv_model(ctx, idx, km, vm, before), "seq", KV_SLOTS)
            # records.ENTRIES[KV]
            tpl = st.templates[key] = (fmt, itemsize(km[1]), itemsize(vm[1]) if vm is not None else 0, program(fmt))
        fmt = tpl[0]
        shape, length, nbytes, hit, bpt, growth = self.build.kv_step(idx, km, vm, before)
        st.seq = seq = st.seq + 1
        v = {"ts": ctx[1], "seq": seq, "step": ctx[2], "fwd": ctx[3], "len": length, "prev": before,
             "new": length - before, "reused": before, "hit": hit, "cb": nbytes, "cmb": nbytes / MIB, "bpt": bpt,
             "grow": growth, "ks": shape_info(shape)[0], "vs": shape_info(vm[0])[0] if vm is not None else "null"}
        self._count("kv_cache_update")
        return [(fmt % v).encode()]

    def _kv_model(self, ctx: Any, idx: int, km: Meta, vm: Optional[Meta], before: int) -> Dict[str, Any]:
        """The KV-cache event a template is made from (the layer's remembered bytes kept)."""
        kvb = self.state.kv_bytes
        prev = kvb.get(idx)
        try:
            return self.template_of(self.build.kv, ctx, idx, km, vm, before)[0]
        finally:
            if prev is None:
                kvb.pop(idx, None)
            else:
                kvb[idx] = prev

    def attention_kv(self, site: Site, end: int, timing: int, in_shape: Any, in_dtype: Any, out_shape: Any,
                     out_dtype: Any, key_shape_before: Any, key_shape: Any,
                     key_dtype: Any, value_shape: Any, value_dtype: Any, allocation: Any) -> Out:
        """A record of the CPU attention wrapper: the attention event, the output allocation
        (``allocation``, an ALLOC record, or None) and the KV-cache event, in the order and with the
        values the general wrapper's records give."""
        st = self.state
        if timing > st.long_ns:
            st.long_ns, st.long_site = timing, site
        seq_first, heads, head_dim, idx = site.attn_static
        q_len, batch = attention_tokens(in_shape, seq_first)
        kv_len = key_shape[-2] if len(key_shape) >= 2 else 0  # the wrapper passes no empty cache
        flops = attention_flops(batch, heads, q_len, kv_len, head_dim)
        before = kv_len_of(key_shape_before)
        tns = end + st.clock_offset
        if not self.fast:
            km, vm = meta(key_shape, key_dtype), meta(value_shape, value_dtype)
            assert km is not None
            out = self.attention(site, tns, timing, meta(in_shape, in_dtype), meta(out_shape, out_dtype), q_len,
                                 kv_len, km, vm, flops)
            if allocation is not None:
                out += self.alloc(*allocation[1:])
            return out + self.kv(site, tns, idx, km, vm, before)
        variant = 0 if flops is None else 2 if flops and timing > 0 else 1
        key = (site, in_shape, in_dtype, out_shape, out_dtype, key_dtype, value_dtype,
               variant)  # records.KEYS[ATTENTION_KV]
        tpl = st.templates.get(key)
        if tpl is None:
            tpl = st.templates[key] = self._attention_kv_templates(site, tns, timing, in_shape, in_dtype, out_shape,
                                                                   out_dtype, q_len, kv_len,
                                                                   key_shape, key_dtype, value_shape, value_dtype,
                                                                       flops, before, variant)
        fa, fk, isz_k, isz_v, _, _ = tpl
        sk, nk = shape_info(key_shape)
        sv, nv = shape_info(value_shape)
        ts = tns // 1000
        step, fwd = st.step, st.forward
        seq = st.seq + 1
        d = timing / 1000.0
        if variant == 2:
            assert flops is not None
            line = fa % (ts, seq, ts, step, fwd, sk, sv, q_len, kv_len, flops, flops / 1e9, d, per_us(flops, d))
        elif variant == 1:
            assert flops is not None
            line = fa % (ts, seq, ts, step, fwd, sk, sv, q_len, kv_len, flops, flops / 1e9, d)
        else:
            line = fa % (ts, seq, ts, step, fwd, sk, sv, q_len, kv_len, d)
        st.seq = seq
        lines = [line.encode()]
        self._count("compute_execution")
        if flops:
            st.pass_flops += flops
            st.total_flops += flops
        if allocation is not None:
            lines += self.alloc(*allocation[1:])
            seq = st.seq
        nbytes = nk * isz_k + nv * isz_v
        kvb = st.kv_bytes
        hit, bpt, growth = kv_figures(kv_len, before, nbytes, kvb.get(idx))
        kvb[idx] = nbytes
        st.seq = seq = seq + 1
        lines.append((fk % (ts, seq, ts, step, fwd, kv_len, before, kv_len - before, before, hit, nbytes,
                            nbytes / MIB, bpt, growth, sk, sv)).encode())
        self._count("kv_cache_update")
        return lines

    def _attention_kv_templates(self, site: Site, tns: int, timing: int, xs: Any, xd: Any, os_: Any, od: Any,
                                q_len: int, kv_len: int, ks: Any, kd: Any, vs: Any, vd: Any, flops: Optional[int],
                                before: int, variant: int) -> Tuple[str, str, int, int, Any, Any]:
        """The entry of ``attention_kv``'s templates (``records.ENTRIES[ATTENTION_KV]``):
        positional templates of the attention and KV-cache events, the cache's item sizes
        and the C programs of both, made from the events the builders make."""
        st = self.state
        ctx = (site, tns // 1000, st.step, st.forward)
        km, vm = meta(ks, kd), meta(vs, vd)
        assert km is not None
        ev = self.template_of(self.build.attention, ctx, timing, meta(xs, xd), meta(os_, od), q_len, kv_len, km, vm,
                              flops)[0]
        slots = dict(TIMED_SLOTS, query_tokens="qt", key_tokens="kt", input_tensors="it")
        if flops is not None:
            slots.update(flops="fl", compute_intensity_gflops="gf")
        fa = compile_template(ev, "seq", slots).replace("%(it)s", _cache_inputs(ev, kd, vd))
        pa = program(fa)
        names = ["ts", "seq", "ts", "step", "fwd", "ks", "vs", "qt", "kt"]
        names += ["d"] if variant == 0 else ["fl", "gf", "d"] if variant == 1 else ["fl", "gf", "d", "tf"]
        fa = positional(fa, names)
        fk = compile_template(self._kv_model(ctx, site.attn_static[3], km, vm, before), "seq", KV_SLOTS)
        pk = program(fk)
        fk = positional(fk, ["ts", "seq", "ts", "step", "fwd", "len", "prev", "new", "reused", "hit", "cb", "cmb",
                             "bpt", "grow", "ks", "vs"])
        return fa, fk, itemsize(kd), itemsize(vd), pa, pk


def _cache_inputs(ev: Dict[str, Any], kd: Any, vd: Any) -> str:
    """An attention event's ``input_tensors`` as a template of the cache's shapes
    (``%(ks)s``, ``%(vs)s``): its hidden states as the builder wrote them."""
    it = ENCODER.encode(ev["input_tensors"][:1])[:-1].replace("%", "%%")
    it += ',{"name":"key_cache","shape":%(ks)s,"dtype":' + ENCODER.encode(dname(kd))
    it += '},{"name":"value_cache","shape":%(vs)s,"dtype":' + ENCODER.encode(dname(vd) if vd is not None else None)
    return it + "}]"

