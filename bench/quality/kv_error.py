"""Per-layer attention error of 2-bit VecInfer key codes on recorded real queries/keys/values (issue 18,
docs/QUALITY.md): which layers break, and which part of the key transform fixes them.

    python -m bench.quality.kv_record MODEL.gguf CALIB.ids 1024 calib.npz   # calibration text
    python -m bench.quality.kv_record MODEL.gguf EVAL.ids 1024 eval.npz     # held-out text
    OFF=0 AUGMAX=32768 python bench/quality/kv_error.py calib.npz eval.npz 0,5,14 base,qw,qwaug

For each layer and scheme it prints (mean relative squared error of the attention output, mean KL
of the attention distribution) over the evaluation queries, with the cache's window rule (4 fp16
sinks, the last 128 tokens in fp16) and values exact (scheme `val`: keys exact, values coded).
Key schemes (d4b8: sub-vectors of 4, 256 centroids per sub-space, k-means on the calibration keys):
  base   VecInfer as shipped before issue 18: post-RoPE keys, lambda = sqrt(max |k|), Hadamard
  qw     query-aware smoothing lambda = (Var k / E q^2)^(1/4) (what calibration now does)
  aug    codebooks trained on keys re-rotated to random positions in [0, AUGMAX) (qwaug: both;
         qwaugmix: half at their own positions, half re-rotated)
  pre    keys coded before RoPE (RoPE applied to the decoded key): a bound, not a shippable kernel
  *mean  per-channel key mean removed first; *_sh one codebook shared by the sub-spaces
  *rot   the pre-RoPE key mean mu, rotated to each block's first position p_b (blocks of BLK tokens),
         removed before coding and added back after: score = q . code(k - R(p_b) mu) + q . R(p_b) mu
         exactly; ROTPAIRS=lo keeps only the rotary pairs that turn less than ROTMAXRAD per block
OFF shifts the evaluation positions (RoPE makes exact attention depend on distances only, so this
asks how codes trained at positions < 1024 do at positions OFF..OFF+1024, i.e. a long context).
"""
import os, sys, math, numpy as np
from pq_tools import make_rope, hadamard, kmeans as pq_tools_kmeans, window_attn_err
np.random.seed(0)
cal = np.load(sys.argv[1]); ev = np.load(sys.argv[2])
layers = [int(x) for x in sys.argv[3].split(',')] if len(sys.argv) > 3 and sys.argv[3] != 'all' else range(int(cal['n_layers']))
schemes = sys.argv[4].split(',') if len(sys.argv) > 4 else ['base', 'mean', 'pre', 'premean']
D = int(cal['head_dim']); n_rot = int(cal['n_rot']); neox = bool(cal['neox']); freqs = cal['freqs']
SINK, R, SUB, K = 4, 128, 4, 256
BLK = float(os.environ.get('BLK', '16'))

rope = make_rope(freqs, n_rot, neox)
Hd = hadamard(D)
kmeans = lambda x, k: pq_tools_kmeans(x, k, 12)

def pq_fit(x, shared):  # x [n, D]
    n = x.shape[0]; s = x.reshape(n, D // SUB, SUB)
    if shared: return kmeans(s.reshape(-1, SUB), K)
    return [kmeans(s[:, j], K) for j in range(D // SUB)]

def pq_apply(x, books, shared):
    n = x.shape[0]; s = x.reshape(n, D // SUB, SUB); out = np.empty_like(s)
    for j in range(D // SUB):
        c = books if shared else books[j]
        d = (s[:, j] ** 2).sum(1)[:, None] - 2 * s[:, j] @ c.T + (c * c).sum(1)[None]
        out[:, j] = c[d.argmin(1)]
    return out.reshape(n, D)

class KeyCodec:
    def __init__(self, kind, kcal, poscal, shared, qcal=None):  # kcal: pre-RoPE keys [n, D] of one head
        self.kind, self.shared = kind, shared
        pre = kind.startswith('pre')
        if 'aug' in kind:  # post-RoPE codes, books trained on keys rotated to random positions
            rng = np.random.default_rng(1)
            nrep = 1 if 'mix' in kind else 4
            reps = [rope(kcal[SINK:, None, :], rng.uniform(0, AUGMAX, len(kcal) - SINK))[:, 0] for _ in range(nrep)]
            if 'mix' in kind: reps.append(rope(kcal[:, None, :], poscal)[:, 0][SINK:])
            x = np.concatenate(reps)
        else:
            x = kcal if pre else rope(kcal[:, None, :], poscal)[:, 0]
            x = x[SINK:]
        self.mu = x.mean(0) if 'mean' in kind else np.zeros(D)
        self.mu_pre = None
        if 'rot' in kind:
            self.mu_pre = rot_mean(kcal[SINK:])
            x = x - rot_offset(self.mu_pre, poscal[SINK:])
        y = x - self.mu
        self.lam = np.maximum(np.sqrt(np.abs(y).max(0)), 1e-4)
        if kind.startswith('qw'):  # query-weighted smoothing: lambda_c = (Var k_c / E q_c^2)^(1/4)
            if 'aug' in kind:
                rng = np.random.default_rng(2)
                qq = np.concatenate([rope(qcal[SINK:], rng.uniform(0, AUGMAX, len(qcal) - SINK)) for _ in range(1 if 'mix' in kind else 4)] + ([rope(qcal, poscal)[SINK:]] if 'mix' in kind else []))
                qq = np.concatenate([qcal[:SINK], qq])
            else:
                qq = rope(qcal, poscal) if not pre else qcal
            Q = (qq[SINK:] ** 2).mean((0, 1)); V = y.var(0)
            self.lam = np.maximum((V / np.maximum(Q, 1e-12)) ** 0.25, 1e-6)
        z = (y / self.lam) @ Hd.T
        self.books = pq_fit(z, shared)
    def decode_post(self, k, pos):  # returns post-RoPE reconstructed keys
        pre = self.kind.startswith('pre')
        x = k if pre else rope(k[:, None, :], pos)[:, 0]
        off = rot_offset(self.mu_pre, pos) if self.mu_pre is not None else 0.0
        z = ((x - off - self.mu) / self.lam) @ Hd.T
        zq = pq_apply(z, self.books, self.shared)
        xq = (zq @ Hd) * self.lam + self.mu + off
        return rope(xq[:, None, :], pos)[:, 0] if pre else xq

def rot_mean(kpre):  # pre-RoPE key mean, restricted to the rotary pairs ROTPAIRS selects
    mu = kpre.mean(0)
    if os.environ.get('ROTPAIRS', 'all') == 'lo':
        slow = freqs * BLK < float(os.environ.get('ROTMAXRAD', '0.05'))  # per pair
        h = n_rot // 2
        keep = np.ones(D, bool)
        if neox: keep[:h] = slow; keep[h:n_rot] = slow
        else: keep[0:n_rot:2] = slow; keep[1:n_rot:2] = slow
        mu = np.where(keep, mu, 0.0)
    top = int(os.environ.get('ROTTOP', '0'))  # keep only the top pairs by mean energy
    if top:
        h = n_rot // 2
        if neox: e = mu[:h] ** 2 + mu[h:n_rot] ** 2
        else: e = mu[0:n_rot:2] ** 2 + mu[1:n_rot:2] ** 2
        slow = np.zeros(h, bool); slow[np.argsort(-e)[:top]] = True
        keep = np.zeros(D, bool)
        if neox: keep[:h] = slow; keep[h:n_rot] = slow
        else: keep[0:n_rot:2] = slow; keep[1:n_rot:2] = slow
        mu = np.where(keep, mu, 0.0)
    return mu

def rot_offset(mu, pos):  # R(p_b) mu for each position's block start p_b
    ref = np.floor(pos / BLK) * BLK
    return rope(np.broadcast_to(mu, (len(pos), 1, D)).copy(), ref)[:, 0]

def attn_err(q, k, v, kq, vq, pos):  # q [n,G,D] post-rope; k,kq [n,D] post-rope
    return window_attn_err(q, k, v, kq, vq, pos, SINK, R)

OFF = float(os.environ.get("OFF", "0")); AUGMAX = float(os.environ.get("AUGMAX", "32768"))
posc = cal['pos'].astype(np.float64); pose = ev['pos'].astype(np.float64) + OFF
print('layer ' + ' '.join(f'{s:>18}' for s in schemes) + '   |mu|/rms  (out-err, score-KL)')
tot = {s: [] for s in schemes}
for l in layers:
    kc = cal[f'k{l}'].astype(np.float64); ke = ev[f'k{l}'].astype(np.float64)
    qe = rope(ev[f'q{l}'].astype(np.float64), pose); ve = ev[f'v{l}'].astype(np.float64)
    Hkv = kc.shape[1]; G = qe.shape[1] // Hkv
    row = []
    for s in schemes:
        shared = s.endswith('_sh'); kind = s.replace('_sh', '')
        e = []
        for h in range(Hkv):
            kpost = rope(ke[:, h:h+1], pose)[:, 0]
            if kind == 'val':
                vb = pq_fit(cal[f'v{l}'][SINK:, h].astype(np.float64), shared)
                vq = pq_apply(ve[:, h], vb, shared)
                e.append(attn_err(qe[:, h*G:(h+1)*G], kpost, ve[:, h], kpost, vq, pose))
                continue
            codec = KeyCodec(kind, kc[:, h], posc, shared, cal[f'q{l}'][:, h*G:(h+1)*G].astype(np.float64))
            kqpost = codec.decode_post(ke[:, h], pose)
            e.append(attn_err(qe[:, h*G:(h+1)*G], kpost, ve[:, h], kqpost, None, pose))
        e = np.array(e).mean(0); tot[s].append(e); row.append(f'({e[0]:.4f},{e[1]:.4f})')
    mu = kc[SINK:].mean(0); ratio = np.linalg.norm(mu) / np.sqrt((kc[SINK:] ** 2).sum(-1).mean())
    print(f'{l:5d} ' + ' '.join(f'{r:>18}' for r in row) + f'   {ratio:.2f}', flush=True)
print('mean  ' + ' '.join(f'({np.mean([t[0] for t in tot[s]]):.4f},{np.mean([t[1] for t in tot[s]]):.4f})' for s in schemes))
