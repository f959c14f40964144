"""The tree-verify fixtures the target tests share: a small tree, its mask and positions, and the check that one
tree verify equals each root-to-node path decoded from scratch."""

from __future__ import annotations

import torch

TOL = 1e-4

# A small tree: node 0 is the root (last accepted token); parents listed per node.
TREE_PARENTS = [-1, 0, 0, 1, 1, 2, 3, 5]


def tree_inputs(parents, past):
    n = len(parents)
    anc = torch.eye(n, dtype=torch.bool)
    depth = [0] * n
    for i, p in enumerate(parents):
        if p >= 0:
            anc[i] |= anc[p]
            depth[i] = depth[p] + 1
    mask = torch.cat([torch.ones(n, past, dtype=torch.bool), anc], dim=1)
    return mask, torch.tensor(depth) + past


def path_to(parents, i):
    path = []
    while i >= 0:
        path.append(i)
        i = parents[i]
    return path[::-1]


def assert_tree_verify(ours, last_logits, prompt, nodes, tol=TOL):
    """One tree verify of `nodes` (TREE_PARENTS) after `prompt` equals `last_logits(ids)` of each root-to-node path
    decoded from scratch."""
    cache = ours.new_cache(len(prompt) + len(nodes) + 8)
    mask, pos = tree_inputs(TREE_PARENTS, len(prompt))
    with torch.no_grad():
        ours(torch.tensor([prompt]), cache=cache)
        tree = ours(torch.tensor([nodes]), cache=cache, positions=pos, mask=mask).logits[0]
    for leaf in range(len(nodes)):
        path = [nodes[i] for i in path_to(TREE_PARENTS, leaf)]
        assert (tree[leaf] - last_logits(prompt + path)).abs().max() < tol, f"node {leaf}"
