"""CPU emulation (float64 torch) of the GDN T kernel's algebra at each tl.dot precision (no GPU, no Triton).

Triton's interpreter computes every dot in float32 whatever `input_precision` says, so this script is
the evidence for the TRI knobs in kernels/triton/gdn_chunk.py. "tf32": operands rounded to 10 mantissa
bits, products accumulated in float32; "tf32x3": a = hi + lo split, hi*hi + hi*lo + lo*hi; "ieee":
float32. L = tril(beta exp(gamma_t - gamma_s) k_t . k_s) from bf16 normalised keys (128 wide), 64 x 64,
64 chunks per kind: random keys, correlated keys (a shared direction + 0.3 / 0.1 noise), identical keys
(beta = 1). Prints the max error of T relative to max |T| against float64, and how many entries of
bf16(T) / fp16(T) differ from the float32 twin's (torch solve_triangular in float32, then rounded).

    python tools/probes/gdn_tri_numerics.py
"""

import torch

torch.manual_seed(0)
D = torch.float64


def tf32(x):  # float32 values rounded to tf32 (10 mantissa bits), nearest, ties away (cvt.rna)
    x = x.to(torch.float32)
    b = x.view(torch.int32)
    b = (b + 0x1000) & ~0x1FFF  # round half away on magnitude bits
    return b.view(torch.float32).to(D)


def f32(x):
    return x.to(torch.float32).to(D)


def dot(a, b, prec):
    if prec == "ieee":
        return f32(f32(a) @ f32(b))
    if prec == "tf32":
        return f32(tf32(a) @ tf32(b))
    if prec == "tf32x3":
        ah, bh = tf32(a), tf32(b)
        al, bl = tf32(f32(a) - ah), tf32(f32(b) - bh)
        return f32(ah @ bh + ah @ bl + al @ bh)


def neumann(L, prec, newton=True, nprec="ieee"):
    S = L.shape[-1]
    I = torch.eye(S, dtype=D)
    N1 = -L
    N2 = dot(N1, N1, prec)
    N4 = dot(N2, N2, prec)
    N8 = dot(N4, N4, prec)
    X = dot(I + N1, I + N2, prec)
    X = dot(X, I + N4, prec)
    X = dot(X, I + N8, prec)
    if newton:
        R = f32(I - dot(I + L, X, nprec))
        X = f32(X + dot(X, R, nprec))
    return X


def subst(L):  # fp32 forward substitution, row by row (FLA style)
    S = L.shape[-1]
    X = torch.zeros_like(L)
    for i in range(S):
        a = -L[..., i, :].clone()
        a[..., i:] = 0
        row = f32(a + f32((a[..., :, None] * X).sum(-2)))
        X[..., i, :] = row
    return X + torch.eye(S, dtype=D)


def full(L, diag, prec, mprec, newton=None, nprec="ieee"):
    S = 16
    B = [[L[..., i * S : (i + 1) * S, j * S : (j + 1) * S] for j in range(4)] for i in range(4)]
    X = [[None] * 4 for _ in range(4)]
    for i in range(4):
        X[i][i] = neumann(B[i][i], prec, nprec=nprec) if diag == "neumann" else subst(B[i][i])
    for d in range(1, 4):
        for i in range(d, 4):
            j = i - d
            acc = 0
            for l in range(j, i):
                acc = acc + dot(B[i][l], X[l][j], mprec)
            X[i][j] = -dot(X[i][i], f32(acc), mprec)
    Z = torch.zeros_like(B[0][0])
    T = torch.cat([torch.cat([X[i][j] if j <= i else Z for j in range(4)], -1) for i in range(4)], -2)
    if newton:
        I = torch.eye(64, dtype=D)
        R = f32(I - dot(I + L, T, newton))
        T = f32(T + dot(T, R, "tf32"))
    return T


def make_L(kind, n=64, K=128, batch=64):
    if kind == "random":
        k = torch.randn(batch, n, K, dtype=D)
    elif kind == "corr":
        k = torch.randn(batch, 1, K, dtype=D) + 0.1 * torch.randn(batch, n, K, dtype=D)
    elif kind == "corr03":
        k = torch.randn(batch, 1, K, dtype=D) + 0.3 * torch.randn(batch, n, K, dtype=D)
    elif kind == "same":
        k = torch.randn(batch, 1, K, dtype=D).expand(batch, n, K).clone()
    k = k / k.norm(dim=-1, keepdim=True)
    k = k.to(torch.bfloat16).to(D)
    beta = torch.rand(batch, n, dtype=D) * 0.5 + 0.5 if kind != "same" else torch.ones(batch, n, dtype=D)
    g = -torch.rand(batch, n, dtype=D) * 0.05
    gam = g.cumsum(-1)
    kk = f32(k @ k.transpose(-1, -2))
    L = f32(beta[..., :, None] * torch.exp(gam[..., :, None] - gam[..., None, :]) * kk)
    return torch.tril(L, -1)


bf = lambda x: x.to(torch.bfloat16).to(D)
hf = lambda x: x.to(torch.float16).to(D)
variants = {
    "neumann tf32x3 + newton tf32x3, merge tf32x3": dict(diag="neumann", prec="tf32x3", mprec="tf32x3", nprec="tf32x3"),
    "neumann tf32 + newton tf32x3, merge tf32x3": dict(diag="neumann", prec="tf32", mprec="tf32x3", nprec="tf32x3"),
    "current: neumann ieee + newton, merge ieee": dict(diag="neumann", prec="ieee", mprec="ieee"),
    "neumann tf32 + ieee newton, merge ieee": dict(diag="neumann", prec="tf32", mprec="ieee"),
    "neumann tf32x3 + ieee newton, merge ieee": dict(diag="neumann", prec="tf32x3", mprec="ieee"),
    "neumann tf32x3 + newton, merge tf32": dict(diag="neumann", prec="tf32x3", mprec="tf32"),
    "neumann tf32x3 + newton, merge tf32x3": dict(diag="neumann", prec="tf32x3", mprec="tf32x3"),
    "neumann ieee + newton, merge tf32": dict(diag="neumann", prec="ieee", mprec="tf32"),
    "subst fp32, merge ieee": dict(diag="subst", prec="ieee", mprec="ieee"),
    "subst fp32, merge tf32": dict(diag="subst", prec="ieee", mprec="tf32"),
    "subst fp32, merge tf32x3": dict(diag="subst", prec="ieee", mprec="tf32x3"),
    "subst fp32, merge tf32 + 64 newton(tf32x3)": dict(diag="subst", prec="ieee", mprec="tf32", newton="tf32x3"),
}


def main():
    for kind in ["random", "corr03", "corr", "same"]:
        L = make_L(kind)
        I = torch.eye(64, dtype=D)
        T64 = torch.linalg.solve_triangular(I + L, I.expand_as(L), upper=False, unitriangular=True)
        twin = f32(
            torch.linalg.solve_triangular((I + L).float(), I.float().expand_as(L), upper=False, unitriangular=True).to(
                D
            )
        )
        sc = T64.abs().amax((-1, -2), keepdim=True)
        print(
            f"== {kind}: max|T| {T64.abs().max():.3g}  twin fp32 rel err {((twin - T64).abs() / sc).max():.2e}; "
            f"bf16(twin) rel err {((bf(twin) - T64).abs() / sc).max():.2e}"
        )
        for name, v in variants.items():
            T = full(L, **v)
            e = ((T - T64).abs() / sc).max().item()
            fb = (bf(T) != bf(twin)).double().mean().item()
            fh = (hf(T) != hf(twin)).double().mean().item()
            print(f"  {name:48s} rel err {e:.2e}   bf16 != bf16(twin) {fb:.4f}  fp16 != fp16(twin) {fh:.4f}")


if __name__ == "__main__":
    main()
