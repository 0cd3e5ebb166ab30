"""Key (and value) transforms for product VQ, per layer, on recorded real activations (issue 18,
docs/QUALITY.md "Learned key transform"): which dense transform before d4b8 codes gives the lowest
attention error. Recordings from bench/quality/kv_record.py (see kv_error.py's header):

    python bench/quality/kv_transform.py calib.npz eval.npz 0,5,14,27 qw,qmp,gmp,qwp,val,valp

For each layer and scheme: (mean relative squared error of the attention output, mean KL of the
attention distribution) over the evaluation queries, keys coded (values exact) or, for val*, values
coded (keys exact). Every token is coded except 4 sinks and the last 128 (the cache's window).
K=entries per book (256), NCAL=calibration rows used. Schemes (Sq: queries' second moment, Sk: keys'
covariance, both per KV head over the calibration recording; "balanced": eigen-directions dealt into
sub-spaces of 4 with equal products of variances):
  qw      diag lambda=(Var k/E q^2)^(1/4), Hadamard (calibrate --key-transform hadamard)
  qm      A = Sq^(1/2) (full query second moment), Hadamard
  qmp     A = Sq^(1/2), PCA of A k, balanced grouping of eigen-directions
  qmph    A = Sq^(1/2), PCA, then Hadamard
  gm      B = Sk^-1 # Sq (matrix geometric mean), A = B^(1/2), Hadamard
  gmp     as gm, then PCA + balanced grouping (what `calibrate --key-transform learned` builds)
  qwp     diag qw lambda, then PCA + balanced grouping
  val     values coded as they are (shipped); valp PCA + balanced; valh Hadamard; valw PCA sorted
Keys post-RoPE with their mean removed (per-sub-space k-means is translation-equivariant).
"""
import os, sys, math, numpy as np
from pq_tools import make_rope, hadamard, kmeans as pq_tools_kmeans, window_attn_err
np.random.seed(0)
cal = np.load(sys.argv[1]); ev = np.load(sys.argv[2])
layers = [int(x) for x in sys.argv[3].split(',')] if sys.argv[3] != 'all' else range(int(cal['n_layers']))
schemes = sys.argv[4].split(',')
D = int(cal['head_dim']); n_rot = int(cal['n_rot']); neox = bool(cal['neox']); freqs = cal['freqs']
SINK, R, SUB = 4, 128, 4
K = int(os.environ.get('K', '256'))
NCAL = int(os.environ.get('NCAL', '100000'))

rope = make_rope(freqs, n_rot, neox)
Hd = hadamard(D)
kmeans = lambda x, k: pq_tools_kmeans(x, k, 15)

def pq_fit(x):
    n = x.shape[0]; s = x.reshape(n, D // SUB, SUB)
    return [kmeans(s[:, j], K) for j in range(D // SUB)]

def pq_apply(x, books):
    n = x.shape[0]; s = x.reshape(n, D // SUB, SUB); out = np.empty_like(s)
    for j in range(D // SUB):
        c = books[j]
        d = (s[:, j] ** 2).sum(1)[:, None] - 2 * s[:, j] @ c.T + (c * c).sum(1)[None]
        out[:, j] = c[d.argmin(1)]
    return out.reshape(n, D)

def msqrt(S, p=0.5):
    w, V = np.linalg.eigh(S); w = np.maximum(w, 1e-12 * w.max())
    return (V * w ** p) @ V.T

def balanced_perm(ev):  # eigen-directions (desc) into D/SUB groups with equal log-products (greedy)
    G = D // SUB; order = np.argsort(-ev); logs = np.log(np.maximum(ev, 1e-12 * ev.max()))
    groups = [[] for _ in range(G)]; tot = np.zeros(G)
    for i in order:
        cand = [g for g in range(G) if len(groups[g]) < SUB]
        g = min(cand, key=lambda g: tot[g]); groups[g].append(i); tot[g] += logs[i]
    return np.array([i for g in groups for i in g])

class Codec:
    def __init__(self, kind, kc, qc):  # kc [n,D] post-RoPE keys; qc [n,G,D] post-RoPE queries
        x = kc[SINK:]; self.mu = x.mean(0); y = x - self.mu
        q = qc[SINK:].reshape(-1, D)
        Sq = q.T @ q / len(q); Sk = y.T @ y / len(y)
        if kind.startswith('val'):
            A = np.eye(D); T = np.eye(D)
            if kind == 'valp':
                w, V = np.linalg.eigh(Sk); T = V[:, balanced_perm(w)].T
            if kind == 'valh': T = Hd
            if kind == 'valw':  # whiten-ish: PCA, balanced groups, on values scaled by nothing; sorted groups
                w, V = np.linalg.eigh(Sk); T = V[:, np.argsort(-w)].T
        elif kind == 'qw':
            lam = np.maximum((np.diag(Sk) / np.maximum(np.diag(Sq), 1e-12)) ** 0.25, 1e-6)
            A = np.diag(1 / lam) ; T = Hd
        elif kind in ('qm', 'qmp', 'qmph'):
            A = msqrt(Sq)
            if kind == 'qm': T = Hd
            else:
                C = A @ Sk @ A.T; w, V = np.linalg.eigh(C)
                P = V[:, balanced_perm(w)].T
                T = P if kind == 'qmp' else Hd @ V.T
        elif kind in ('gm', 'gmp'):
            Ski = np.linalg.inv(Sk + 1e-9 * np.trace(Sk) / D * np.eye(D))
            r = msqrt(Ski); ri = msqrt(Sk + 1e-9 * np.trace(Sk) / D * np.eye(D))
            B = r @ msqrt(ri @ Sq @ ri) @ r  # Sk^-1 # Sq
            A = msqrt(B)
            if kind == 'gm': T = Hd
            else:
                C = A @ Sk @ A.T; w, V = np.linalg.eigh(C); T = V[:, balanced_perm(w)].T
        elif kind == 'qwp':
            lam = np.maximum((np.diag(Sk) / np.maximum(np.diag(Sq), 1e-12)) ** 0.25, 1e-6)
            A = np.diag(1 / lam); C = A @ Sk @ A.T; w, V = np.linalg.eigh(C); T = V[:, balanced_perm(w)].T
        else: raise SystemExit(kind)
        self.M = T @ A; self.Mi = np.linalg.inv(self.M)
        self.books = pq_fit(y[:NCAL] @ self.M.T)
    def decode(self, k):
        z = (k - self.mu) @ self.M.T
        return pq_apply(z, self.books) @ self.Mi.T + self.mu

def attn_err(q, k, v, kq, pos):  # keys coded, values exact
    return window_attn_err(q, k, v, kq, None, pos, SINK, R)

def attn_err_v(q, k, v, vq, pos):  # values coded, keys exact
    return window_attn_err(q, k, v, k, vq, pos, SINK, R)

posc = cal['pos'].astype(np.float64); pose = ev['pos'].astype(np.float64)
print('layer ' + ' '.join(f'{s:>18}' for s in schemes), flush=True)
tot = {s: [] for s in schemes}
for l in layers:
    kc = rope(cal[f'k{l}'].astype(np.float64), posc); ke = rope(ev[f'k{l}'].astype(np.float64), pose)
    qc = rope(cal[f'q{l}'].astype(np.float64), posc); qe = rope(ev[f'q{l}'].astype(np.float64), pose)
    ve = ev[f'v{l}'].astype(np.float64)
    Hkv = kc.shape[1]; G = qe.shape[1] // Hkv
    row = []
    for s in schemes:
        e = []
        for h in range(Hkv):
            if s.startswith('val'):
                vc = cal[f'v{l}'].astype(np.float64)[:, h]
                c = Codec(s, vc, qc[:, h*G:(h+1)*G])
                e.append(attn_err_v(qe[:, h*G:(h+1)*G], ke[:, h], ve[:, h], c.decode(ve[:, h]), pose)); continue
            c = Codec(s, kc[:, h], qc[:, h*G:(h+1)*G])
            e.append(attn_err(qe[:, h*G:(h+1)*G], ke[:, h], ve[:, h], c.decode(ke[:, h]), pose))
        e = np.array(e).mean(0); tot[s].append(e); row.append(f'({e[0]:.4f},{e[1]:.4f})')
    print(f'{l:5d} ' + ' '.join(f'{r:>18}' for r in row), flush=True)
print('mean  ' + ' '.join(f'({np.mean([t[0] for t in tot[s]]):.4f},{np.mean([t[1] for t in tot[s]]):.4f})' for s in schemes))
