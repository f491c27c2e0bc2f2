"""Tests of the `normlab` Python module (python/normlab_module.cpp).

Run by CTest as `Python.normlab` with Debian's /usr/bin/python3 and PYTHONPATH at the built module:
    PYTHONPATH=build/release/python /usr/bin/python3 -m unittest discover -s python/tests -v

What they check: the binding passes arrays, axes, strides and options through correctly. Each function is
compared with a float64 NumPy reference written from the math (the kernels themselves are tested in depth
by the C++ suite, against LibTorch and finite differences). The reference backward formulas are checked
against central finite differences of the float64 forward here too.
"""
import json
import os
import tempfile
import unittest
import wave

import numpy as np

import normlab

F32_EPS = float(np.finfo(np.float32).eps)


def assert_close(test, actual, ref, k=16.0, scale=1.0, what=""):
    """The one tolerance rule (as tests/support/tolerance.h): |a - ref| <= k * FLT_EPSILON * max(|ref|, scale)."""
    actual = np.asarray(actual, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    test.assertEqual(actual.shape, ref.shape, what)
    bound = k * F32_EPS * np.maximum(np.abs(ref), scale)
    err = np.abs(actual - ref)
    worst = np.unravel_index(np.argmax(err - bound), err.shape) if err.size else None
    test.assertTrue(np.all(err <= bound),
                    f"{what}: worst at {worst}: {actual[worst]} vs {ref[worst]} (bound {bound[worst]:.3g})")


# ---- float64 references -------------------------------------------------------------------------------

def ref_norm(x, axes, eps, center=True):
    """(x̂, rstd) over `axes`, float64, with the biased variance (LayerNorm) or the mean square (RMSNorm)."""
    x = np.asarray(x, np.float64)
    axes = tuple(a % x.ndim for a in axes)
    mean = x.mean(axis=axes, keepdims=True) if center else 0.0
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    return (x - mean) * rstd, rstd


def affine_shape(x, axes):
    """Shape that broadcasts weight (the normalized axes' shape) against x."""
    axes = sorted(a % x.ndim for a in axes)
    return [x.shape[i] if i in axes else 1 for i in range(x.ndim)]


def ref_layer_norm(x, w, b, axes, eps, center=True):
    xhat, _ = ref_norm(x, axes, eps, center)
    shp = affine_shape(x, axes)
    y = xhat * (np.reshape(w, shp) if w is not None else 1.0)
    return y + (np.reshape(b, shp) if b is not None else 0.0)


def ref_layer_norm_backward(dy, x, w, axes, eps, center=True):
    """dx, dγ, dβ of LayerNorm (center) or RMSNorm, float64."""
    dy = np.asarray(dy, np.float64)
    xhat, rstd = ref_norm(x, axes, eps, center)
    axes_n = tuple(a % x.ndim for a in axes)
    rest = tuple(i for i in range(x.ndim) if i not in axes_n)
    shp = affine_shape(x, axes)
    g = dy * (np.reshape(w, shp) if w is not None else 1.0)
    proj = (g * xhat).mean(axis=axes_n, keepdims=True)
    gm = g.mean(axis=axes_n, keepdims=True) if center else 0.0
    dx = rstd * (g - gm - xhat * proj)
    dw = (dy * xhat).sum(axis=rest).reshape([x.shape[i] for i in sorted(axes_n)])
    db = dy.sum(axis=rest).reshape(dw.shape)
    return dx, dw, db


def rng_array(rng, shape, scale=1.0, offset=0.0):
    return (rng.standard_normal(shape) * scale + offset).astype(np.float32)


class LayerNormTest(unittest.TestCase):
    def test_hand_computed_case_over_f(self):
        # [[1,2,3],[3,4,5]] over the first axis (F of an [F, T] matrix), eps 0: every column is (−1, 1).
        x = np.array([[1, 2, 3], [3, 4, 5]], np.float32)
        y = normlab.layer_norm(x, axes=[0], eps=0.0)
        np.testing.assert_array_equal(y, [[-1, -1, -1], [1, 1, 1]])
        y, mean, rstd = normlab.layer_norm(x, axes=[0], eps=0.0, return_stats=True)
        np.testing.assert_array_equal(mean, [2, 3, 4])
        np.testing.assert_array_equal(rstd, [1, 1, 1])

    def test_any_axes_and_strides_match_float64(self):
        rng = np.random.default_rng(1)
        cases = [((7, 33), [-1]), ((3, 80, 17), [1]), ((4, 5, 6), [0, 2]), ((2, 1025), [1]), ((5, 1), [1]),
                 ((3, 4, 5, 6), [1, 2, 3])]
        for shape, axes in cases:
            for layout in ("contiguous", "transposed", "sliced"):
                base = rng_array(rng, [2 * n for n in shape], 2.0, 3.0)
                x = base[tuple(slice(0, None, 2) for _ in shape)]  # every other element: strided
                if layout == "contiguous":
                    x = np.ascontiguousarray(x)
                elif layout == "transposed":
                    x = np.ascontiguousarray(x.T).T  # Fortran order: the last axis has the largest stride
                norm_shape = [shape[a % len(shape)] for a in sorted(a % len(shape) for a in axes)]
                w = rng_array(rng, norm_shape, 0.5, 1.0)
                b = rng_array(rng, norm_shape)
                with self.subTest(shape=shape, axes=axes, layout=layout):
                    y = normlab.layer_norm(x, w, b, axes=axes, eps=1e-5)
                    self.assertEqual(y.dtype, np.float32)
                    ref = ref_layer_norm(x, w, b, axes, 1e-5)
                    assert_close(self, y, ref, scale=np.abs(ref).max(), what="y")
                    dy = rng_array(rng, shape)
                    dx, dw, db = normlab.layer_norm_backward(dy, x, w, axes=axes, eps=1e-5)
                    rdx, rdw, rdb = ref_layer_norm_backward(dy, x, w, axes, 1e-5)
                    _, rstd = ref_norm(x, axes, 1e-5)
                    dx_scale = max(np.abs(rdx).max(), rstd.max() * np.abs(dy).max() * np.abs(w).max())
                    n_rest = x.size // w.size
                    assert_close(self, dx, rdx, k=64, scale=dx_scale, what="dx")
                    assert_close(self, dw, rdw, k=16 * n_rest, scale=np.abs(rdw).max(), what="dweight")
                    assert_close(self, db, rdb, k=16 * n_rest, scale=np.abs(rdb).max(), what="dbias")

    def test_large_offset_keeps_precision(self):
        # The mean is kept in extra precision: at offset 1e4 the result is as accurate as at offset 0.
        rng = np.random.default_rng(2)
        x = rng_array(rng, (8, 768), 1.0, 1e4)
        y = normlab.layer_norm(x)
        assert_close(self, y, ref_layer_norm(x, None, None, [-1], 1e-5), k=8 * 1e4 * 2, scale=1.0, what="y")
        # and the error is far below the 1e-3 of a float32 mean
        self.assertLess(np.abs(y - ref_layer_norm(x, None, None, [-1], 1e-5)).max(), 1e-3)

    def test_float64_input_is_converted(self):
        x = np.array([[1.0, 2.0, 3.0]])
        y = normlab.layer_norm(x, eps=0.0)
        self.assertEqual(y.dtype, np.float32)
        assert_close(self, y, ref_layer_norm(x, None, None, [-1], 0.0))
        # Converted as np.asarray(a, np.float32) would: the same bits as from that array, for a strided
        # float64 view, integers, and the float32-only operations' inputs (there a nested list too).
        rng = np.random.default_rng(11)
        x64 = rng.standard_normal((6, 66)) * 3 + 1
        strided = x64[:, ::2]
        w64 = rng.standard_normal(33)
        np.testing.assert_array_equal(normlab.layer_norm(strided, w64),
                                      normlab.layer_norm(strided.astype(np.float32), w64.astype(np.float32)))
        ints = np.arange(12, dtype=np.int64).reshape(3, 4) ** 2
        np.testing.assert_array_equal(normlab.rms_norm(ints), normlab.rms_norm(ints.astype(np.float32)))
        nested = [[[1, 2, 4], [3, 5, 9]]]  # a list, for the float32-only operations
        np.testing.assert_array_equal(normlab.group_norm(nested, 1),
                                      normlab.group_norm(np.array(nested, np.float32), 1))
        dy64 = rng.standard_normal((6, 33))
        for a, b in zip(normlab.group_norm_backward(dy64, strided, 3),
                        normlab.group_norm_backward(dy64.astype(np.float32), strided.astype(np.float32), 3)):
            np.testing.assert_array_equal(a, b)
        # Text is refused with NumPy's message, through either conversion.
        with self.assertRaisesRegex(ValueError, "could not convert string to float"):
            normlab.layer_norm(np.array([["a", "b"]]))
        with self.assertRaisesRegex(ValueError, "could not convert string to float"):
            normlab.group_norm(np.array([[["a", "b"]]]), 1)

    def test_float16_storage(self):
        rng = np.random.default_rng(3)
        x32 = rng_array(rng, (9, 100), 1.0, 0.5)
        x = x32.astype(np.float16)
        w = rng_array(rng, (100,), 0.5, 1.0)
        b = rng_array(rng, (100,))
        y = normlab.layer_norm(x, w, b)
        self.assertEqual(y.dtype, np.float16)
        # fp32 arithmetic on the float16 inputs, rounded once to float16: within one float16 ulp of the exact value
        ref = ref_layer_norm(x.astype(np.float64), w, b, [-1], 1e-5)
        ulp = np.spacing(np.abs(ref).astype(np.float16)).astype(np.float64)
        self.assertTrue(np.all(np.abs(y.astype(np.float64) - ref) <= ulp))
        dy = rng_array(rng, x.shape).astype(np.float16)
        dx, dw, db = normlab.layer_norm_backward(dy, x, w)
        self.assertEqual(dx.dtype, np.float16)
        rdx, rdw, rdb = ref_layer_norm_backward(dy, x, w, [-1], 1e-5)
        ulp = np.spacing(np.abs(rdx).astype(np.float16)).astype(np.float64)
        self.assertTrue(np.all(np.abs(dx.astype(np.float64) - rdx) <= ulp + 1e-3 * np.abs(rdx).max()))
        assert_close(self, dw, rdw, k=16 * 9, scale=np.abs(rdw).max(), what="dweight")
        rms = normlab.rms_norm(x, w)
        self.assertEqual(rms.dtype, np.float16)
        ref = ref_layer_norm(x.astype(np.float64), w, None, [-1], normlab_rms_eps(), center=False)
        ulp = np.spacing(np.abs(ref).astype(np.float16)).astype(np.float64)
        self.assertTrue(np.all(np.abs(rms.astype(np.float64) - ref) <= ulp))

    def test_reference_backward_matches_finite_differences(self):
        # The float64 references above are right: central differences of the float64 forward.
        rng = np.random.default_rng(4)
        for center in (True, False):
            x = rng.standard_normal((3, 5))
            w = rng.standard_normal(5)
            dy = rng.standard_normal((3, 5))
            dx, dw, _ = ref_layer_norm_backward(dy, x, w, [-1], 1e-5, center)
            h = 1e-6
            for idx in np.ndindex(x.shape):
                xp, xm = x.copy(), x.copy()
                xp[idx] += h
                xm[idx] -= h
                fd = (np.sum(dy * ref_layer_norm(xp, w, None, [-1], 1e-5, center))
                      - np.sum(dy * ref_layer_norm(xm, w, None, [-1], 1e-5, center))) / (2 * h)
                self.assertAlmostEqual(dx[idx], fd, delta=1e-6 * max(1.0, abs(fd)))
            for j in range(5):
                wp, wm = w.copy(), w.copy()
                wp[j] += h
                wm[j] -= h
                fd = (np.sum(dy * ref_layer_norm(x, wp, None, [-1], 1e-5, center))
                      - np.sum(dy * ref_layer_norm(x, wm, None, [-1], 1e-5, center))) / (2 * h)
                self.assertAlmostEqual(dw[j], fd, delta=1e-6 * max(1.0, abs(fd)))

    def test_add_layer_norm_returns_the_sum(self):
        rng = np.random.default_rng(5)
        x, r = rng_array(rng, (6, 64)), rng_array(rng, (6, 64))
        w, b = rng_array(rng, (64,), 0.5, 1.0), rng_array(rng, (64,))
        y, s = normlab.add_layer_norm(x, r, w, b)
        np.testing.assert_array_equal(s, x + r)
        np.testing.assert_array_equal(y, normlab.layer_norm(s, w, b))


def normlab_rms_eps():
    return 1e-6  # kRmsNormEps, the module's default


class RmsNormTest(unittest.TestCase):
    def test_matches_float64(self):
        rng = np.random.default_rng(6)
        for shape, axes in [((5, 80), [-1]), ((3, 40, 9), [1]), ((2, 3, 4), [0, 1, 2])]:
            x = rng_array(rng, shape, 2.0, 1.0)
            nshape = [shape[a % len(shape)] for a in sorted(a % len(shape) for a in axes)]
            w = rng_array(rng, nshape, 0.5, 1.0)
            with self.subTest(shape=shape, axes=axes):
                y, rstd = normlab.rms_norm(x, w, axes=axes, return_stats=True)
                ref = ref_layer_norm(x, w, None, axes, 1e-6, center=False)
                assert_close(self, y, ref, scale=np.abs(ref).max(), what="y")
                dy = rng_array(rng, shape)
                dx, dw = normlab.rms_norm_backward(dy, x, w, axes=axes)
                rdx, rdw, _ = ref_layer_norm_backward(dy, x, w, axes, 1e-6, center=False)
                _, r = ref_norm(x, axes, 1e-6, center=False)
                assert_close(self, dx, rdx, k=64, scale=r.max() * np.abs(dy).max() * np.abs(w).max(), what="dx")
                assert_close(self, dw, rdw, k=16 * (x.size // w.size), scale=np.abs(rdw).max(), what="dw")


def ref_batch_norm(x, w, b, eps, lengths=None):
    """Training-mode BatchNorm over [N, C, T] (per channel over N and T), float64; padded steps excluded."""
    x = np.asarray(x, np.float64)
    n, c, t = x.shape
    mask = np.ones((n, 1, t))
    if lengths is not None:
        for i, L in enumerate(lengths):
            mask[i, :, L:] = 0
    cnt = mask.sum(axis=(0, 2))
    mean = (x * mask).sum(axis=(0, 2)) / cnt
    var = (((x - mean[None, :, None]) ** 2) * mask).sum(axis=(0, 2)) / cnt
    y = (x - mean[None, :, None]) / np.sqrt(var[None, :, None] + eps)
    y = y * np.asarray(w)[None, :, None] + np.asarray(b)[None, :, None]
    return y * mask, mean, var, cnt


class SavedStatsTest(unittest.TestCase):
    def test_layer_norm_backward_from_saved_stats_has_the_recomputing_bits(self):
        rng = np.random.default_rng(30)
        # [B, F, T] over F (a strided middle axis) and contiguous rows, float32 and float16 storage
        for shape, axes in (((2, 33, 7), [1]), ((5, 1025), [-1]), ((3, 4, 6), [0, 2])):
            for dtype in (np.float32, np.float16):
                x = rng_array(rng, shape, 2.0, 3.0).astype(dtype)
                nshape = [shape[a % len(shape)] for a in sorted(a % len(shape) for a in axes)]
                w, b = rng_array(rng, nshape, 0.5, 1.0), rng_array(rng, nshape)
                dy = rng_array(rng, shape).astype(dtype)
                y, mean, rstd, st = normlab.layer_norm(x, w, b, axes, 1e-5, return_stats=True, save_stats=True)
                np.testing.assert_array_equal(y, normlab.layer_norm(x, w, b, axes))
                self.assertIsInstance(st, normlab.NormStats)
                self.assertTrue(st.center)
                self.assertEqual(st.shape, list(shape))
                self.assertEqual(st.eps, 1e-5)
                self.assertEqual(st.mean.dtype, np.float64)
                self.assertEqual(st.mean.shape, mean.shape)
                np.testing.assert_array_equal(st.mean.astype(np.float32), mean)
                np.testing.assert_array_equal(st.rstd.astype(np.float32), rstd)
                saved = normlab.layer_norm_backward_saved(dy, x, st, w)
                again = normlab.layer_norm_backward(dy, x, w, axes, 1e-5)
                for a, r, what in zip(saved, again, ("dx", "dweight", "dbias")):
                    self.assertEqual(a.dtype, r.dtype, what)
                    np.testing.assert_array_equal(a, r, what)
                if dtype == np.float32:  # and against the float64 reference
                    rdx, rdw, _ = ref_layer_norm_backward(dy, x, w, axes, 1e-5)
                    assert_close(self, saved[0], rdx, k=64, scale=np.abs(rdx).max(), what="dx")
                    assert_close(self, saved[1], rdw, k=64 * x.size / rdw.size, scale=np.abs(rdw).max(),
                                 what="dweight")

    def test_rms_norm_backward_from_saved_stats(self):
        rng = np.random.default_rng(31)
        x = rng_array(rng, (8, 80), 1.0, 0.5)
        w = rng_array(rng, (80,), 0.5, 1.0)
        dy = rng_array(rng, x.shape)
        y, st = normlab.rms_norm(x, w, save_stats=True)
        np.testing.assert_array_equal(y, normlab.rms_norm(x, w))
        self.assertFalse(st.center)
        self.assertIsNone(st.mean)
        self.assertEqual(st.rstd.shape, (8,))
        dx, dw = normlab.rms_norm_backward_saved(dy, x, st, w)
        rdx, rdw = normlab.rms_norm_backward(dy, x, w)
        np.testing.assert_array_equal(dx, rdx)
        np.testing.assert_array_equal(dw, rdw)

    def test_mismatched_input_is_refused(self):
        rng = np.random.default_rng(32)
        x = rng_array(rng, (4, 16))
        _, st = normlab.layer_norm(x, save_stats=True)
        _, rst = normlab.rms_norm(x, save_stats=True)
        with self.assertRaises(normlab.Error):
            normlab.layer_norm_backward_saved(rng_array(rng, (4, 17)), rng_array(rng, (4, 17)), st)
        with self.assertRaises(normlab.Error):  # RMSNorm statistics for a LayerNorm backward
            normlab.layer_norm_backward_saved(x, x, rst)
        with self.assertRaises(normlab.Error):  # weight of the wrong shape
            normlab.layer_norm_backward_saved(x, x, st, rng_array(rng, (15,)))


class ChannelNormStatsTest(unittest.TestCase):
    def test_backward_from_saved_stats_has_the_recomputing_bits(self):
        rng = np.random.default_rng(33)
        for shape, groups, lengths in (((4, 32, 16), 0, None), ((2, 7, 100), 0, None), ((3, 4, 9), 0, [5, 0, 9]),
                                       ((3, 32, 16), 16, None), ((4, 32, 16), 4, None), ((30, 24), 6, None)):
            x = rng_array(rng, shape, 2.0, 3.0)
            w, b = rng_array(rng, (shape[1],), 0.5, 1.0), rng_array(rng, (shape[1],))
            dy = rng_array(rng, shape)
            if groups:
                y, st = normlab.group_norm(x, groups, w, b, save_stats=True)
                np.testing.assert_array_equal(y, normlab.group_norm(x, groups, w, b))
                saved = normlab.group_norm_backward_saved(dy, x, st, w)
                again = normlab.group_norm_backward(dy, x, groups, w)
                self.assertTrue(st.group)
                self.assertEqual(st.groups, groups)
                self.assertEqual(st.mean.shape, (shape[0], groups))
            else:
                y, st = normlab.instance_norm(x, w, b, lengths=lengths, save_stats=True)
                np.testing.assert_array_equal(y, normlab.instance_norm(x, w, b, lengths=lengths))
                saved = normlab.instance_norm_backward_saved(dy, x, st, w)
                again = normlab.instance_norm_backward(dy, x, w, lengths=lengths)
                self.assertFalse(st.group)
                self.assertEqual(st.mean.shape, shape[:2])
            self.assertIsInstance(st, normlab.ChannelNormStats)
            self.assertEqual(st.shape, list(shape))
            self.assertEqual(st.eps, 1e-5)
            self.assertEqual(st.mean.dtype, np.float64)
            self.assertEqual(st.rstd.shape, st.mean.shape)
            for a, r, what in zip(saved, again, ("dx", "dweight", "dbias")):
                np.testing.assert_array_equal(a, r, f"{shape} {groups} {what}")

    def test_mismatched_input_is_refused(self):
        rng = np.random.default_rng(34)
        x = rng_array(rng, (2, 8, 5))
        _, ist = normlab.instance_norm(x, save_stats=True)
        _, gst = normlab.group_norm(x, 2, save_stats=True)
        with self.assertRaises(normlab.Error):  # another shape
            normlab.instance_norm_backward_saved(rng_array(rng, (3, 8, 5)), rng_array(rng, (3, 8, 5)), ist)
        with self.assertRaises(normlab.Error):  # GroupNorm statistics for an InstanceNorm backward
            normlab.instance_norm_backward_saved(x, x, gst)
        with self.assertRaises(normlab.Error):
            normlab.group_norm_backward_saved(x, x, ist)


class BatchNormStatsTest(unittest.TestCase):
    def test_backward_from_saved_stats_has_the_recomputing_bits(self):
        rng = np.random.default_rng(35)
        # (64, 64, 250): large enough for the channel-blocked passes, whose backward takes the segments'
        # kept means; the others recompute.
        for shape, lengths in (((64, 64, 250), None), ((64, 64, 250), [250 - 3 * i for i in range(64)]),
                               ((4, 8, 33), None), ((3, 4, 9), [5, 0, 9])):
            x = rng_array(rng, shape, 2.0, 3.0)
            w, b = rng_array(rng, (shape[1],), 0.5, 1.0), rng_array(rng, (shape[1],))
            dy = rng_array(rng, shape)
            y, st = normlab.batch_norm(x, weight=w, bias=b, lengths=lengths, save_stats=True)
            np.testing.assert_array_equal(y, normlab.batch_norm(x, weight=w, bias=b, lengths=lengths))
            self.assertIsInstance(st, normlab.BatchNormStats)
            self.assertEqual(st.shape, list(shape))
            self.assertEqual(st.channel_axis, 1)
            self.assertEqual(st.eps, 1e-5)
            self.assertEqual(st.mean.dtype, np.float64)
            self.assertEqual(st.mean.shape, (shape[1],))
            self.assertEqual(st.rstd.shape, (shape[1],))
            saved = normlab.batch_norm_backward_saved(dy, x, st, w)
            again = normlab.batch_norm_backward(dy, x, w, lengths=lengths)
            for a, r, what in zip(saved, again, ("dx", "dweight", "dbias")):
                np.testing.assert_array_equal(a, r, f"{shape} {what}")

    def test_misuse_is_refused(self):
        rng = np.random.default_rng(36)
        x = rng_array(rng, (2, 8, 5))
        _, st = normlab.batch_norm(x, save_stats=True)
        with self.assertRaises(normlab.Error):  # another shape
            normlab.batch_norm_backward_saved(rng_array(rng, (3, 8, 5)), rng_array(rng, (3, 8, 5)), st)
        rm, rv = np.zeros(8, np.float32), np.ones(8, np.float32)
        with self.assertRaises(normlab.Error):  # eval mode keeps none
            normlab.batch_norm(x, rm, rv, training=False, save_stats=True)


def bf16_bits(f):
    """float32 -> bfloat16 bits, round to nearest even, written from the format (a NaN: its upper 16 bits
    made quiet): the reference for normlab.to_bfloat16 and the kernels' bfloat16 stores."""
    u = np.asarray(f, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (u >> 16) | 0x0040, rounded).astype(np.uint16)


class BFloat16Test(unittest.TestCase):
    def test_conversions(self):
        cases = {  # float32 bits -> bfloat16 bits
            0x3F800000: 0x3F80,  # 1
            0x3F808000: 0x3F80,  # 1 + 2^-8, halfway: to the even 1
            0x3F818000: 0x3F82,  # 1 + 3 * 2^-8, halfway: to the even 1 + 2^-6
            0x3F808001: 0x3F81,  # just above halfway
            0x80000000: 0x8000,  # -0
            0x00000001: 0x0000,  # the smallest subnormal rounds to +0
            0x7F7F7FFF: 0x7F7F,  # just below halfway to 2^128: the largest finite bfloat16
            0x7F7F8000: 0x7F80,  # halfway (0x1.FF8p127): to +inf
            0x7F800000: 0x7F80, 0xFF800000: 0xFF80,  # +-inf
            0x7FC00000: 0x7FC0, 0x7F800001: 0x7FC0, 0xFFA00000: 0xFFE0,  # NaNs stay NaN, quiet, with their sign
        }
        f = np.array(list(cases), np.uint32).view(np.float32)
        bits = normlab.to_bfloat16(f)
        self.assertEqual(bits.dtype, np.uint16)
        self.assertEqual([int(b) for b in bits], list(cases.values()))
        # Random values of every magnitude, strided and in two dimensions; float64 and lists converted first.
        rng = np.random.default_rng(40)
        u = rng.integers(0, 2 ** 32, size=(64, 33), dtype=np.uint64).astype(np.uint32)
        x = u.view(np.float32)
        np.testing.assert_array_equal(normlab.to_bfloat16(x), bf16_bits(x))
        np.testing.assert_array_equal(normlab.to_bfloat16(x[::3, 1::2].T), bf16_bits(x[::3, 1::2].T))
        np.testing.assert_array_equal(normlab.to_bfloat16([[1.0, 2.5]]), [[0x3F80, 0x4020]])
        # Widening is exact for all 65536 patterns (NaN payloads included), from uint16 or int16.
        every = np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16)
        wide = normlab.from_bfloat16(every)
        self.assertEqual(wide.dtype, np.float32)
        np.testing.assert_array_equal(wide.view(np.uint32), every.astype(np.uint32) << 16)
        np.testing.assert_array_equal(normlab.from_bfloat16(every.view(np.int16)[::-1]).view(np.uint32),
                                      every[::-1].astype(np.uint32) << 16)
        finite = wide[np.isfinite(wide)]
        np.testing.assert_array_equal(normlab.to_bfloat16(finite), finite.view(np.uint32) >> 16)
        with self.assertRaisesRegex(normlab.Error, "uint16 or int16"):
            normlab.from_bfloat16(np.ones(3, np.float32))

    def test_storage_is_the_float32_result_rounded_once(self):
        # The documented contract (normlab/norm.h): 16-bit storage widens x exactly, runs the float32 kernels
        # and rounds each output once; mean, rstd, dweight and dbias are those of the float32 call.
        rng = np.random.default_rng(41)
        for shape, axes in (((9, 100), [-1]), ((2, 33, 7), [1]), ((5, 1025), [-1]), ((3, 4, 6), [0, 2])):
            nshape = [shape[a % len(shape)] for a in sorted(a % len(shape) for a in axes)]
            x = normlab.to_bfloat16(rng_array(rng, shape, 2.0, 3.0))
            dy = normlab.to_bfloat16(rng_array(rng, shape))
            w, b = rng_array(rng, nshape, 0.5, 1.0), rng_array(rng, nshape)
            xw, dyw = normlab.from_bfloat16(x), normlab.from_bfloat16(dy)
            y, mean, rstd, st = normlab.layer_norm(x, w, b, axes, return_stats=True, save_stats=True,
                                                   storage="bfloat16")
            self.assertEqual(y.dtype, np.uint16)
            y32, mean32, rstd32 = normlab.layer_norm(xw, w, b, axes, return_stats=True)
            np.testing.assert_array_equal(y, bf16_bits(y32))
            np.testing.assert_array_equal(mean, mean32)
            np.testing.assert_array_equal(rstd, rstd32)
            # within one bfloat16 ulp of the exact value (float64 on the widened x)
            ref = ref_layer_norm(xw, w, b, axes, 1e-5)
            ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(ref), 2.0 ** -126))) - 7)
            self.assertTrue(np.all(np.abs(normlab.from_bfloat16(y) - ref) <= ulp))
            dx, dw, db = normlab.layer_norm_backward(dy, x, w, axes, storage="bfloat16")
            dx32, dw32, db32 = normlab.layer_norm_backward(dyw, xw, w, axes)
            np.testing.assert_array_equal(dx, bf16_bits(dx32))
            np.testing.assert_array_equal(dw, dw32)
            np.testing.assert_array_equal(db, db32)
            for a, r in zip(normlab.layer_norm_backward_saved(dy, x, st, w, storage="bfloat16"), (dx, dw, db)):
                self.assertEqual(a.dtype, r.dtype)
                np.testing.assert_array_equal(a, r)
            # RMSNorm
            y, rstd, st = normlab.rms_norm(x, w, axes, return_stats=True, save_stats=True, storage="bfloat16")
            y32, rstd32 = normlab.rms_norm(xw, w, axes, return_stats=True)
            np.testing.assert_array_equal(y, bf16_bits(y32))
            np.testing.assert_array_equal(rstd, rstd32)
            dx, dw = normlab.rms_norm_backward(dy, x, w, axes, storage="bfloat16")
            dx32, dw32 = normlab.rms_norm_backward(dyw, xw, w, axes)
            np.testing.assert_array_equal(dx, bf16_bits(dx32))
            np.testing.assert_array_equal(dw, dw32)
            for a, r in zip(normlab.rms_norm_backward_saved(dy, x, st, w, storage="bfloat16"), (dx, dw)):
                np.testing.assert_array_equal(a, r)

    def test_bits_read_in_place_whatever_their_strides(self):
        # [B, F, T] over F from a transposed int16 view (as t.view(torch.int16).numpy() gives a PyTorch
        # bfloat16 tensor's bits): the same bits as the contiguous uint16 copy.
        rng = np.random.default_rng(42)
        x = normlab.to_bfloat16(rng_array(rng, (2, 7, 33), 1.5, -2.0)).view(np.int16).transpose(0, 2, 1)
        self.assertFalse(x.flags.c_contiguous)
        y = normlab.layer_norm(x, axes=[1], storage="bfloat16")
        np.testing.assert_array_equal(
            y, normlab.layer_norm(np.ascontiguousarray(x).view(np.uint16), axes=[1], storage="bfloat16"))
        # the example of the brief: [[1, 2, 3], [3, 4, 5]] over F (axis 0) is [[-1, -1, -1], [1, 1, 1]]
        f = normlab.to_bfloat16([[1, 2, 3], [3, 4, 5]])
        np.testing.assert_array_equal(normlab.from_bfloat16(normlab.layer_norm(f, axes=[0], eps=0.0,
                                                                               storage="bfloat16")),
                                      [[-1, -1, -1], [1, 1, 1]])

    def test_storage_errors(self):
        x = np.ones((2, 4), np.float32)
        bits = normlab.to_bfloat16(x)
        with self.assertRaisesRegex(normlab.Error, "x: storage=\"bfloat16\" takes the bfloat16 bits"):
            normlab.layer_norm(x, storage="bfloat16")
        with self.assertRaisesRegex(normlab.Error, "dy: storage=\"bfloat16\""):
            normlab.layer_norm_backward(x, bits, storage="bfloat16")
        with self.assertRaisesRegex(normlab.Error, "dy: storage=\"bfloat16\""):
            normlab.rms_norm_backward(x.astype(np.float16), bits, storage="bfloat16")
        with self.assertRaisesRegex(normlab.Error, "storage must be \"float32\", \"float16\" or \"bfloat16\""):
            normlab.rms_norm(bits, storage="bf16")
        with self.assertRaisesRegex(normlab.Error, "x must be float16"):
            normlab.layer_norm(x, storage="float16")
        # storage="float32" converts a float16 x (and a uint16 one as integers, as np.asarray would)
        self.assertEqual(normlab.layer_norm(x.astype(np.float16), storage="float32").dtype, np.float32)
        np.testing.assert_array_equal(normlab.layer_norm(bits, storage="float32"),
                                      normlab.layer_norm(bits.astype(np.float32)))


class FusedAndFromOutputTest(unittest.TestCase):
    """The fused residual add + norm and the backward from the output (normlab/norm.h's contracts)."""

    SHAPES = (((6, 64), [-1]), ((2, 33, 7), [1]), ((5, 1025), [-1]), ((3, 4, 6), [0, 2]))

    def test_add_norm_is_the_composition_bit_for_bit(self):
        rng = np.random.default_rng(50)
        for shape, axes in self.SHAPES:
            nshape = [shape[a % len(shape)] for a in sorted(a % len(shape) for a in axes)]
            x, r, dy, ds = (rng_array(rng, shape, 1.5, 0.5) for _ in range(4))
            w, b = rng_array(rng, nshape, 0.5, 1.0), rng_array(rng, nshape)
            y, s, mean, rstd, st = normlab.add_layer_norm(x, r, w, b, axes, return_stats=True, save_stats=True)
            np.testing.assert_array_equal(s, x + r)
            for a, ref in zip((y, mean, rstd), normlab.layer_norm(s, w, b, axes, return_stats=True)):
                np.testing.assert_array_equal(a, ref)
            dnorm = normlab.layer_norm_backward(dy, s, w, axes)
            dx, dw, db = normlab.add_layer_norm_backward(dy, s, w, ds, axes)
            np.testing.assert_array_equal(dx, dnorm[0] + ds)  # the gradient of x and of residual
            np.testing.assert_array_equal(dw, dnorm[1])
            np.testing.assert_array_equal(db, dnorm[2])
            for a, ref in zip(normlab.add_layer_norm_backward(dy, s, w, axes=axes), dnorm):  # no ds: ds = 0
                np.testing.assert_array_equal(a, ref)
            for a, ref in zip(normlab.add_layer_norm_backward_saved(dy, s, st, w, ds), (dx, dw, db)):
                np.testing.assert_array_equal(a, ref)
            # RMSNorm
            y, s, rstd, st = normlab.add_rms_norm(x, r, w, axes, return_stats=True, save_stats=True)
            np.testing.assert_array_equal(s, x + r)
            for a, ref in zip((y, rstd), normlab.rms_norm(s, w, axes, return_stats=True)):
                np.testing.assert_array_equal(a, ref)
            dnorm = normlab.rms_norm_backward(dy, s, w, axes)
            dx, dw = normlab.add_rms_norm_backward(dy, s, w, ds, axes)
            np.testing.assert_array_equal(dx, dnorm[0] + ds)
            np.testing.assert_array_equal(dw, dnorm[1])
            for a, ref in zip(normlab.add_rms_norm_backward_saved(dy, s, st, w, ds), (dx, dw)):
                np.testing.assert_array_equal(a, ref)

    def check_add_norm_16bit(self, rng, narrow, wide, dtype, storage):
        # s is x + residual rounded once, y the norm of that s rounded once; dx is the float32 norm gradient
        # plus ds, rounded once (two roundings in the unfused composition); the backward from saved statistics
        # has the same bits. narrow: float32 -> the storage's array, rounded to nearest even (the reference,
        # not normlab's conversion); wide: back to float32, exactly. storage: None (float16 x picks float16).
        for shape, axes in self.SHAPES:
            nshape = [shape[a % len(shape)] for a in sorted(a % len(shape) for a in axes)]
            x, r, dy, ds = (narrow(rng_array(rng, shape, 1.5, 0.5)) for _ in range(4))
            w, b = rng_array(rng, nshape, 0.5, 1.0), rng_array(rng, nshape)
            y, s, mean, rstd, st = normlab.add_layer_norm(x, r, w, b, axes, return_stats=True, save_stats=True,
                                                          storage=storage)
            self.assertEqual((y.dtype, s.dtype), (dtype, dtype))
            np.testing.assert_array_equal(s, narrow(wide(x) + wide(r)))
            for a, ref in zip((y, mean, rstd),
                              normlab.layer_norm(s, w, b, axes, return_stats=True, storage=storage)):
                np.testing.assert_array_equal(a, ref)
            dx, dw, db = normlab.add_layer_norm_backward(dy, s, w, ds, axes, storage=storage)
            self.assertEqual(dx.dtype, dtype)
            d32 = normlab.layer_norm_backward(wide(dy), wide(s), w, axes)
            np.testing.assert_array_equal(dx, narrow(d32[0] + wide(ds)))
            np.testing.assert_array_equal(dw, d32[1])
            np.testing.assert_array_equal(db, d32[2])
            for a, ref in zip(normlab.add_layer_norm_backward_saved(dy, s, st, w, ds, storage=storage),
                              (dx, dw, db)):
                np.testing.assert_array_equal(a, ref)
            y, s, st = normlab.add_rms_norm(x, r, w, axes, save_stats=True, storage=storage)
            np.testing.assert_array_equal(y, normlab.rms_norm(s, w, axes, storage=storage))
            dx, dw = normlab.add_rms_norm_backward(dy, s, w, ds, axes, storage=storage)
            d32 = normlab.rms_norm_backward(wide(dy), wide(s), w, axes)
            np.testing.assert_array_equal(dx, narrow(d32[0] + wide(ds)))
            np.testing.assert_array_equal(dw, d32[1])
            for a, ref in zip(normlab.add_rms_norm_backward_saved(dy, s, st, w, ds, storage=storage), (dx, dw)):
                np.testing.assert_array_equal(a, ref)

    def test_add_norm_bfloat16_rounds_the_sum_once(self):
        self.check_add_norm_16bit(np.random.default_rng(51), bf16_bits, normlab.from_bfloat16, np.uint16,
                                  "bfloat16")

    def test_add_norm_float16_rounds_the_sum_once(self):
        # NumPy's float16 conversion rounds to nearest even.
        def narrow(a):
            return np.asarray(a, np.float32).astype(np.float16)
        self.check_add_norm_16bit(np.random.default_rng(53), narrow, lambda a: a.astype(np.float32), np.float16,
                                  None)

    def test_backward_from_output(self):
        # Against the backward that reads x, within the accuracy norm.h states: x_hat = (y - bias) / weight
        # carries about ulp(y) / |weight| more error (here |weight| >= 0.5, |bias| <= 0.3).
        rng = np.random.default_rng(52)
        for shape, axes in self.SHAPES:
            nshape = [shape[a % len(shape)] for a in sorted(a % len(shape) for a in axes)]
            x, dy = rng_array(rng, shape, 2.0, 1.0), rng_array(rng, shape)
            w = (rng.uniform(0.5, 1.5, nshape) * rng.choice([-1, 1], nshape)).astype(np.float32)
            b = rng.uniform(-0.3, 0.3, nshape).astype(np.float32)
            y, _, rstd = normlab.layer_norm(x, w, b, axes, return_stats=True)
            got = normlab.layer_norm_backward_from_output(dy, y, rstd, w, b, axes)
            ref = normlab.layer_norm_backward(dy, x, w, axes)
            for a, r, what in zip(got, ref, ("dx", "dweight", "dbias")):
                assert_close(self, a, r, k=8, scale=np.abs(r).max(), what=what)
            np.testing.assert_array_equal(got[2], ref[2])  # dbias = sum of dy reads no x
            y, rstd = normlab.rms_norm(x, w, axes, return_stats=True)
            got = normlab.rms_norm_backward_from_output(dy, y, rstd, w, axes)
            for a, r, what in zip(got, normlab.rms_norm_backward(dy, x, w, axes), ("dx", "dweight")):
                assert_close(self, a, r, k=8, scale=np.abs(r).max(), what=what)
        # By hand: [[1, 2, 3], [3, 4, 5]] over F (axis 0), eps 0: every column has rstd 1 and x_hat [-1, 1].
        # dy = [[1, 0, 0], [0, 0, 0]]: column 0 has mean(dy) = 1/2, mean(dy * x_hat) = -1/2, so
        # dx = rstd * (dy - mean(dy) - x_hat * mean(dy * x_hat)) = [1 - 1/2 - 1/2, 0 - 1/2 + 1/2] = [0, 0];
        # dweight[f] = sum over t of dy * x_hat = [-1, 0], dbias[f] = sum of dy = [1, 0].
        f = np.array([[1, 2, 3], [3, 4, 5]], np.float32)
        y, _, rstd = normlab.layer_norm(f, axes=[0], eps=0.0, return_stats=True)
        np.testing.assert_array_equal(y, [[-1, -1, -1], [1, 1, 1]])
        dx, dw, db = normlab.layer_norm_backward_from_output(np.array([[1, 0, 0], [0, 0, 0]], np.float32), y,
                                                             rstd, axes=[0])
        np.testing.assert_array_equal(dx, np.zeros((2, 3), np.float32))
        np.testing.assert_array_equal(dw, [-1, 0])
        np.testing.assert_array_equal(db, [1, 0])

    def test_errors(self):
        x = np.ones((2, 4), np.float32)
        with self.assertRaisesRegex(normlab.Error, "x must be float16"):
            normlab.add_layer_norm(x, x, storage="float16")
        with self.assertRaisesRegex(normlab.Error, "residual must be float16"):
            normlab.add_rms_norm(x.astype(np.float16), x)
        with self.assertRaisesRegex(normlab.Error, "ds: storage=\"bfloat16\""):
            bits = normlab.to_bfloat16(x)
            normlab.add_rms_norm_backward(bits, bits, ds=x, storage="bfloat16")
        with self.assertRaisesRegex(normlab.Error, "s: storage=\"bfloat16\""):
            normlab.add_layer_norm_backward(normlab.to_bfloat16(x), x, storage="bfloat16")
        y, _, rstd = normlab.layer_norm(np.arange(8, dtype=np.float32).reshape(2, 4), return_stats=True)
        with self.assertRaisesRegex(normlab.Error, r"weight\[2\].*is 0"):
            normlab.layer_norm_backward_from_output(x, y, rstd, np.array([1, 1, 0, 1], np.float32))
        with self.assertRaises(normlab.Error):  # rstd of the wrong shape
            normlab.rms_norm_backward_from_output(x, y, np.ones(3, np.float32))


class BatchNormTest(unittest.TestCase):
    def test_training_updates_running_stats_in_place(self):
        rng = np.random.default_rng(7)
        x = rng_array(rng, (4, 3, 50), 2.0, 1.0)
        w, b = rng_array(rng, (3,), 0.5, 1.0), rng_array(rng, (3,))
        rm, rv = np.zeros(3, np.float32), np.ones(3, np.float32)
        y = normlab.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1)
        ref, mean, var, cnt = ref_batch_norm(x, w, b, 1e-5)
        assert_close(self, y, ref, scale=np.abs(ref).max(), what="y")
        # PyTorch's rule: running ← 0.9·running + 0.1·batch, with the unbiased variance
        assert_close(self, rm, 0.1 * mean, k=16, scale=np.abs(mean).max(), what="running_mean")
        assert_close(self, rv, 0.9 + 0.1 * var * cnt / (cnt - 1), k=16, what="running_var")
        # eval mode reads the running statistics
        ye = normlab.batch_norm(x, rm, rv, w, b, training=False)
        refe = (x - rm[None, :, None]) / np.sqrt(rv[None, :, None].astype(np.float64) + 1e-5) * w[None, :, None] \
            + b[None, :, None]
        assert_close(self, ye, refe, scale=np.abs(refe).max(), what="eval y")

    def test_strided_input_matches_contiguous(self):
        # [N, T, C] data seen as [N, C, T] without a copy (channel stride 1) gives the contiguous result.
        rng = np.random.default_rng(14)
        ntc = rng_array(rng, (4, 33, 7), 1.0, 2.0)
        x = ntc.transpose(0, 2, 1)
        self.assertFalse(x.flags.c_contiguous)
        w, b = rng_array(rng, (7,), 0.5, 1.0), rng_array(rng, (7,))
        y = normlab.batch_norm(x, None, None, w, b)
        ref, *_ = ref_batch_norm(x, w, b, 1e-5)
        assert_close(self, y, ref, scale=np.abs(ref).max(), what="y")

    def test_padding_aware_lengths(self):
        rng = np.random.default_rng(8)
        x = rng_array(rng, (3, 4, 20))
        w, b = rng_array(rng, (4,), 0.5, 1.0), rng_array(rng, (4,))
        lengths = [20, 7, 13]
        y = normlab.batch_norm(x, None, None, w, b, lengths=lengths, time_axis=2)
        ref, *_ = ref_batch_norm(x, w, b, 1e-5, lengths)
        assert_close(self, y, ref, scale=np.abs(ref).max(), what="y")
        self.assertTrue(np.all(y[1, :, 7:] == 0) and np.all(y[2, :, 13:] == 0))

    def test_backward_matches_layer_norm_over_batch_and_time(self):
        # Training BatchNorm over [N, C, T] is LayerNorm over axes (0, 2) with a per-channel affine.
        rng = np.random.default_rng(9)
        x = rng_array(rng, (5, 3, 17))
        w = rng_array(rng, (3,), 0.5, 1.0)
        dy = rng_array(rng, x.shape)
        dx, dw, db = normlab.batch_norm_backward(dy, x, w)
        rdx, _, _ = ref_layer_norm_backward(dy * w[None, :, None], x, None, [0, 2], 1e-5)
        xhat, rstd = ref_norm(x, [0, 2], 1e-5)
        rdw, rdb = (dy * xhat).sum(axis=(0, 2)), dy.astype(np.float64).sum(axis=(0, 2))
        assert_close(self, dx, rdx, k=64, scale=rstd.max() * np.abs(dy).max() * np.abs(w).max(), what="dx")
        assert_close(self, dw, rdw, k=16 * 85, scale=np.abs(rdw).max(), what="dweight")
        assert_close(self, db, rdb, k=16 * 85, scale=np.abs(rdb).max(), what="dbias")

    def test_running_stats_must_be_writable_float32(self):
        x = np.ones((2, 3, 4), np.float32)
        with self.assertRaisesRegex(normlab.Error, "running_mean must be a float32 array"):
            normlab.batch_norm(x, np.zeros(3), np.ones(3, np.float32))
        ro = np.zeros(3, np.float32)
        ro.flags.writeable = False
        with self.assertRaisesRegex(normlab.Error, "running_mean must be writable"):
            normlab.batch_norm(x, ro, np.ones(3, np.float32))


class GroupAndInstanceNormTest(unittest.TestCase):
    def test_group_norm_is_layer_norm_over_each_group(self):
        rng = np.random.default_rng(10)
        x = rng_array(rng, (2, 6, 11), 1.5, -2.0)
        w, b = rng_array(rng, (6,), 0.5, 1.0), rng_array(rng, (6,))
        y = normlab.group_norm(x, 3, w, b)
        xg = x.reshape(2, 3, 2, 11)
        ref = ref_layer_norm(xg, None, None, [2, 3], 1e-5).reshape(x.shape) * w[None, :, None] + b[None, :, None]
        assert_close(self, y, ref, scale=np.abs(ref).max(), what="y")
        dy = rng_array(rng, x.shape)
        dx, dw, db = normlab.group_norm_backward(dy, x, 3, w)
        g = (dy * w[None, :, None]).reshape(2, 3, 2, 11)
        rdx, _, _ = ref_layer_norm_backward(g, xg, None, [2, 3], 1e-5)
        xhat, rstd = ref_norm(xg, [2, 3], 1e-5)
        assert_close(self, dx, rdx.reshape(x.shape), k=64, scale=rstd.max() * np.abs(g).max(), what="dx")
        assert_close(self, dw, (dy * xhat.reshape(x.shape)).sum(axis=(0, 2)), k=16 * 22, scale=10, what="dw")
        assert_close(self, db, dy.astype(np.float64).sum(axis=(0, 2)), k=16 * 22, scale=10, what="db")

    def test_instance_norm_is_group_norm_with_one_channel_per_group(self):
        rng = np.random.default_rng(11)
        x = rng_array(rng, (3, 4, 25))
        w, b = rng_array(rng, (4,), 0.5, 1.0), rng_array(rng, (4,))
        y = normlab.instance_norm(x, w, b)
        ref = ref_layer_norm(x, None, None, [2], 1e-5) * w[None, :, None] + b[None, :, None]
        assert_close(self, y, ref, scale=np.abs(ref).max(), what="y")
        dy = rng_array(rng, x.shape)
        dx, dw, db = normlab.instance_norm_backward(dy, x, w)
        gdx, gdw, gdb = normlab.group_norm_backward(dy, x, 4, w)
        assert_close(self, dx, gdx, k=64, scale=np.abs(gdx).max(), what="dx")
        assert_close(self, dw, gdw, k=64, scale=np.abs(gdw).max(), what="dw")
        assert_close(self, db, gdb, k=64, scale=np.abs(gdb).max(), what="db")


class ErrorsTest(unittest.TestCase):
    def test_bad_input_raises_normlab_error(self):
        x = np.ones((2, 3), np.float32)
        self.assertTrue(issubclass(normlab.Error, ValueError))
        with self.assertRaisesRegex(normlab.Error, "eps"):
            normlab.layer_norm(x, eps=-1.0)
        with self.assertRaises(normlab.Error):
            normlab.layer_norm(x, axes=[2])
        with self.assertRaises(normlab.Error):
            normlab.layer_norm(np.ones((0, 3), np.float32))
        with self.assertRaises(normlab.Error):
            normlab.layer_norm(x, weight=np.ones(4, np.float32))
        with self.assertRaises(normlab.Error):
            normlab.group_norm(np.ones((2, 6, 4), np.float32), 4)
        with self.assertRaises(normlab.Error):
            normlab.set_isa("no-such-isa")
        with self.assertRaisesRegex(normlab.Error, "dy must be float16"):
            normlab.layer_norm_backward(x, x.astype(np.float16))

    def test_misaligned_and_odd_strides(self):
        buf = np.zeros(4 * 9 + 1, np.uint8)
        x = np.frombuffer(buf.data, dtype=np.float32, count=9, offset=1)  # at a byte offset of 1
        with self.assertRaisesRegex(normlab.Error, "not aligned"):
            normlab.layer_norm(x)
        odd = np.lib.stride_tricks.as_strided(np.zeros(20, np.float32), shape=(3,), strides=(6,))
        with self.assertRaisesRegex(normlab.Error, "not a multiple of the element size"):
            normlab.layer_norm(odd)


class DeterminismTest(unittest.TestCase):
    def test_same_bits_for_every_thread_count_and_isa(self):
        rng = np.random.default_rng(12)
        x = rng_array(rng, (300, 257), 1.0, 5.0)
        dy = rng_array(rng, x.shape)
        saved_threads, saved_isa = normlab.num_threads(), normlab.isa()
        try:
            results = []
            for isa in normlab.supported_isas():
                for t in (1, 2, 3):
                    normlab.set_isa(isa)
                    normlab.set_num_threads(t)
                    self.assertEqual((normlab.isa(), normlab.num_threads()), (isa, t))
                    results.append((normlab.layer_norm(x), *normlab.layer_norm_backward(dy, x)))
            for r in results[1:]:
                for a, b in zip(r, results[0]):
                    np.testing.assert_array_equal(a, b)
        finally:
            normlab.set_isa(saved_isa)
            normlab.set_num_threads(saved_threads)


class OutputStorageTest(unittest.TestCase):
    """The arrays the module returns live in the library's tensor storage (normlab/tensor.h): 2 MiB or more
    in a mapping of its own that starts on a 2 MiB boundary (advised for transparent huge pages), the data a
    multiple of 512 bytes into its first page (staggered from one array to the next), unless
    NORMLAB_HUGE_PAGES=0; owned by the array."""

    def assertMappedStorage(self, a):
        if os.environ.get("NORMLAB_HUGE_PAGES", "1") != "0":
            self.assertEqual(a.ctypes.data // 4096 * 4096 % (2 << 20), 0)
            self.assertEqual(a.ctypes.data % 512, 0)

    def test_large_outputs_are_mapped_on_a_2_mib_boundary_and_own_their_memory(self):
        x = np.ones((1024, 1024), np.float32)  # 4 MiB
        x[:, ::2] = 3.0
        y, mean, rstd = normlab.layer_norm(x, eps=0.0, return_stats=True)
        self.assertTrue(y.flags.c_contiguous and y.flags.writeable)
        self.assertEqual(y.shape, x.shape)
        self.assertMappedStorage(y)
        del x, mean, rstd
        # (every element of a row of alternating 3, 1 is ±1: the values survive the other arrays' release)
        np.testing.assert_array_equal(np.abs(y), np.ones((1024, 1024), np.float32))
        y[0, 0] = 7.0  # writable, and its own memory
        self.assertEqual(float(y[0, 0]), 7.0)
        small = normlab.layer_norm(np.array([[1, 2, 3]], np.float32))
        self.assertEqual(small.ctypes.data % 64, 0)
        self.assertTrue(small.flags.writeable)

    def test_empty_makes_arrays_in_that_storage(self):
        a = normlab.empty((1024, 1024))
        self.assertEqual((a.shape, a.dtype), ((1024, 1024), np.float32))
        self.assertTrue(a.flags.c_contiguous and a.flags.writeable)
        self.assertMappedStorage(a)
        a[:] = 2.0
        a[:, ::2] = 4.0
        np.testing.assert_array_equal(normlab.layer_norm(a, eps=0.0)[0, :4], [1, -1, 1, -1])
        for dtype in (np.float16, np.float64, "int32"):
            b = normlab.empty([3, 0, 2], dtype)
            self.assertEqual((b.shape, b.dtype), ((3, 0, 2), np.dtype(dtype)))
        self.assertEqual(normlab.empty([]).shape, ())
        with self.assertRaises(normlab.Error):
            normlab.empty([2, -1])
        with self.assertRaises(normlab.Error):  # more bytes than fit in memory
            normlab.empty([2 ** 62, 8])


FIXTURES = os.environ.get("NORMLAB_FIXTURES_DIR",
                          os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures"))


class SpeechTest(unittest.TestCase):
    def test_fbank_matches_torchaudio_float64_fixture(self):
        # tests/fixtures/fbank: torchaudio.compliance.kaldi.fbank in float64 (make_fbank_fixtures.py).
        with open(os.path.join(FIXTURES, "fbank", "manifest.json")) as f:
            manifest = json.load(f)
        cases = dict(manifest["cases"])
        for name in ("bins80_16k", "bins23_8k"):
            case = cases[name]
            flags = case["flags"]
            rate = float(flags.get("sample-frequency", 16000))
            samples, got_rate = normlab.read_wav(os.path.join(FIXTURES, "fbank", case["wav"]),
                                                 expected_sample_rate=rate)
            self.assertEqual(got_rate, rate)
            feats = normlab.fbank(samples, sample_rate=rate, num_mel_bins=int(flags.get("num-mel-bins", 23)),
                                  dither=0.0)
            ref = np.load(os.path.join(FIXTURES, "fbank", name + ".f64.npy"))
            self.assertEqual(list(feats.shape), case["shape"])
            self.assertLessEqual(np.abs(feats - ref).max(), 1e-4, name)

    def test_read_wav_rejects_a_malformed_file(self):
        with tempfile.NamedTemporaryFile(suffix=".wav") as f:
            f.write(b"RIFF\x00\x00\x00\x00WAVEjunk")
            f.flush()
            with self.assertRaises(normlab.Error):
                normlab.read_wav(f.name)

    def test_read_wav_normalize(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "a.wav")
            pcm = np.array([0, 16384, -32768, 32767], np.int16)
            with wave.open(path, "wb") as w:
                w.setnchannels(1)
                w.setsampwidth(2)
                w.setframerate(16000)
                w.writeframes(pcm.tobytes())
            s, rate = normlab.read_wav(path)
            np.testing.assert_array_equal(s, pcm.astype(np.float32))
            s, _ = normlab.read_wav(path, normalize=True)
            np.testing.assert_array_equal(s, pcm.astype(np.float32) / 32768)

    def test_sliding_cmvn_matches_kaldi_fixture(self):
        # tests/fixtures/cmvn: Kaldi apply-cmvn-sliding outputs (make_cmvn_fixtures.py).
        with open(os.path.join(FIXTURES, "cmvn", "manifest.json")) as f:
            manifest = json.load(f)
        for case in manifest["cases"]:
            x = np.load(os.path.join(FIXTURES, "cmvn", case["name"] + ".x.npy"))
            for v in case["variants"]:
                with self.subTest(case=case["name"], variant=v["variant"]):
                    ref = np.load(os.path.join(FIXTURES, "cmvn", v["kaldi"]))
                    y = normlab.sliding_cmvn(x, cmn_window=case["cmn_window"],
                                             min_cmn_window=case["min_cmn_window"], center=v["center"],
                                             norm_vars=v["norm_vars"])
                    # the [D, T] layout gives the same result through time_axis = 1, without a copy
                    yt = normlab.sliding_cmvn(np.asarray(x, np.float32).T, cmn_window=case["cmn_window"],
                                              min_cmn_window=case["min_cmn_window"], center=v["center"],
                                              norm_vars=v["norm_vars"], time_axis=1)
                    np.testing.assert_array_equal(yt.T, y)
                    assert_close(self, y, ref, k=256, scale=max(1.0, np.abs(ref).max()), what="y")

    def test_cmvn_per_utterance(self):
        rng = np.random.default_rng(13)
        x = rng_array(rng, (40, 5), 3.0, 100.0)
        y = normlab.cmvn_per_utterance(x)
        ref = x.astype(np.float64) - x.astype(np.float64).mean(axis=0)
        assert_close(self, y, ref, k=64, scale=100.0, what="means")
        y = normlab.cmvn_per_utterance(x, norm_vars=True)
        ref = ref / x.astype(np.float64).std(axis=0)
        assert_close(self, y, ref, k=64, scale=np.abs(ref).max(), what="vars")



class CmvnTest(unittest.TestCase):
    """Global statistics, the backward, padded batches and the stream (normlab/cmvn.h)."""

    def test_stats_and_apply_cmvn(self):
        rng = np.random.default_rng(60)
        a, b = rng_array(rng, (40, 5), 3.0, 100.0), rng_array(rng, (17, 5), 2.0, 90.0)
        st = normlab.CmvnStats()
        self.assertEqual(st.dim, 0)
        st.add(a)
        st.add(b.T.astype(np.float64), time_axis=1)  # [D, T], converted
        both = np.concatenate([a, b]).astype(np.float64)
        self.assertEqual((st.dim, st.count), (5, 57.0))
        np.testing.assert_allclose(st.sum, both.sum(axis=0), rtol=1e-14)
        np.testing.assert_allclose(st.sum_sq, (both ** 2).sum(axis=0), rtol=1e-14)
        merged = normlab.CmvnStats(5)
        merged.add(st)
        merged.add(st)
        self.assertEqual(merged.count, 114.0)
        np.testing.assert_array_equal(merged.sum, 2 * st.sum)
        # Kaldi's [2, D+1] layout and WeNet's JSON, in memory and through files
        k = st.to_kaldi_matrix()
        self.assertEqual(k.shape, (2, 6))
        np.testing.assert_array_equal(k[0], np.append(st.sum, 57.0))
        np.testing.assert_array_equal(k[1], np.append(st.sum_sq, 0.0))
        back = normlab.CmvnStats.from_kaldi_matrix(k)
        np.testing.assert_array_equal(back.sum_sq, st.sum_sq)
        self.assertEqual(json.loads(st.to_wenet_json())["frame_num"], 57)
        with tempfile.TemporaryDirectory() as d:
            st.save_kaldi_npy(os.path.join(d, "cmvn.npy"))
            np.testing.assert_array_equal(np.load(os.path.join(d, "cmvn.npy")), k)
            np.testing.assert_array_equal(normlab.CmvnStats.load_kaldi_npy(os.path.join(d, "cmvn.npy")).sum, st.sum)
            st.save_wenet_json(os.path.join(d, "global_cmvn"))
            w = normlab.CmvnStats.load_wenet_json(os.path.join(d, "global_cmvn"))
            np.testing.assert_array_equal(w.sum, st.sum)
            self.assertEqual(w.count, 57.0)
        # apply-cmvn: x - mean, (x - mean) / sqrt(var) with the biased variance; its backward
        mean = both.mean(axis=0)
        std = np.sqrt((both ** 2).mean(axis=0) - mean ** 2)
        assert_close(self, normlab.apply_cmvn(a, st), a - mean, k=16, scale=100.0, what="means")
        ref = (a - mean) / std
        assert_close(self, normlab.apply_cmvn(a, st, norm_vars=True), ref, k=16, scale=np.abs(ref).max(),
                     what="vars")
        np.testing.assert_array_equal(normlab.apply_cmvn(a.T, st, time_axis=1).T, normlab.apply_cmvn(a, st))
        np.testing.assert_array_equal(normlab.apply_cmvn(a, st, norm_means=False), a)
        dy = rng_array(rng, a.shape)
        np.testing.assert_array_equal(normlab.apply_cmvn_backward(dy, st), dy)
        assert_close(self, normlab.apply_cmvn_backward(dy, st, norm_vars=True), dy / std, k=16,
                     scale=np.abs(dy / std).max(), what="backward")
        with self.assertRaises(normlab.Error):  # stats of another width
            normlab.apply_cmvn(np.ones((3, 4), np.float32), st)
        with self.assertRaises(normlab.Error):  # not [2, D+1]
            normlab.CmvnStats.from_kaldi_matrix(np.ones((3, 6)))
        with self.assertRaises(normlab.Error):
            normlab.CmvnStats.from_wenet_json("{}")

    def test_per_utterance_backward(self):
        rng = np.random.default_rng(61)
        x, dy = rng_array(rng, (40, 5), 3.0, 10.0), rng_array(rng, (40, 5))
        d64 = dy.astype(np.float64)
        assert_close(self, normlab.cmvn_per_utterance_backward(dy, x), d64 - d64.mean(axis=0), k=16,
                     scale=np.abs(d64).max(), what="means")
        # with norm_vars: LayerNorm's backward over time with eps 0 and no affine
        ref, _, _ = ref_layer_norm_backward(dy, x, None, [0], 0.0)
        assert_close(self, normlab.cmvn_per_utterance_backward(dy, x, norm_vars=True), ref, k=16,
                     scale=np.abs(ref).max(), what="vars")
        assert_close(self, normlab.cmvn_per_utterance_backward(dy.T, x.T, norm_vars=True, time_axis=1), ref.T,
                     k=16, scale=np.abs(ref).max(), what="[D, T]")

    def test_padded_batches_are_each_utterance_alone(self):
        rng = np.random.default_rng(62)
        x, dy = rng_array(rng, (3, 30, 4), 2.0, 5.0), rng_array(rng, (3, 30, 4))
        lengths = [30, 11, 0]
        for norm_vars in (False, True):
            y = normlab.cmvn_per_utterance(x, norm_vars, lengths=lengths)
            s = normlab.sliding_cmvn(x, cmn_window=8, min_cmn_window=3, norm_vars=norm_vars, lengths=lengths)
            dx = normlab.cmvn_per_utterance_backward(dy, x, norm_vars, lengths=lengths)
            for bi, n in enumerate(lengths):
                if n:
                    np.testing.assert_array_equal(y[bi, :n], normlab.cmvn_per_utterance(x[bi, :n], norm_vars))
                    np.testing.assert_array_equal(
                        s[bi, :n], normlab.sliding_cmvn(x[bi, :n], cmn_window=8, min_cmn_window=3,
                                                        norm_vars=norm_vars))
                    np.testing.assert_array_equal(
                        dx[bi, :n], normlab.cmvn_per_utterance_backward(dy[bi, :n], x[bi, :n], norm_vars))
                for a in (y, s, dx):
                    np.testing.assert_array_equal(a[bi, n:], 0.0)
        with self.assertRaises(normlab.Error):  # a length beyond T
            normlab.cmvn_per_utterance(x, lengths=[31, 1, 1])

    def test_streaming_equals_the_causal_sliding_window(self):
        rng = np.random.default_rng(63)
        x = rng_array(rng, (53, 6), 2.0, -3.0)
        for norm_vars in (False, True):
            ref = normlab.sliding_cmvn(x, cmn_window=20, min_cmn_window=0, norm_vars=norm_vars)
            sc = normlab.StreamingCmvn(6, cmn_window=20, norm_vars=norm_vars)
            for _ in range(2):  # a second utterance after reset
                out = [sc.accept(x[i:i + 7]) for i in range(0, 53, 7)] + [sc.accept(x[:0])]
                self.assertEqual(sc.frames_seen, 53)
                np.testing.assert_array_equal(np.concatenate(out), ref)
                sc.reset()
            # [D, n] chunks through time_axis = 1, one frame at a time
            st = normlab.StreamingCmvn(6, cmn_window=20, norm_vars=norm_vars, time_axis=1)
            np.testing.assert_array_equal(np.concatenate([st.accept(x[i:i + 1].T) for i in range(53)], axis=1),
                                          ref.T)
        with self.assertRaisesRegex(normlab.Error, "causal"):
            normlab.StreamingCmvn(6, min_cmn_window=100)
        # the per-frame LayerNorm over F: layer_norm of the whole utterance, bit for bit
        w, b = rng_array(rng, (6,), 0.5, 1.0), rng_array(rng, (6,))
        ln = normlab.StreamingLayerNormF(6, w, b)
        np.testing.assert_array_equal(np.concatenate([ln.accept(x[i:i + 5]) for i in range(0, 53, 5)]),
                                      normlab.layer_norm(x, w, b))
        self.assertEqual(ln.frames_seen, 53)
        lt = normlab.StreamingLayerNormF(6, time_axis=1)
        np.testing.assert_array_equal(np.concatenate([lt.accept(x[i:i + 9].T) for i in range(0, 53, 9)], axis=1),
                                      normlab.layer_norm(x.T, axes=[0]))
        with self.assertRaises(normlab.Error):  # a chunk of the wrong width
            normlab.StreamingCmvn(6).accept(np.ones((2, 5), np.float32))

if __name__ == "__main__":
    unittest.main()
