import pytest
import torch

from schedrl.training.batch import collate


def test_collate_masks_only_completion_targets():
    # rows: [p p | c c c] and [p | c], pad = 0
    b = collate([[5, 6], [7]], [[8, 9, 10], [11]], pad_id=0, behaviour_logp=[[-1.0, -2.0, -3.0], [-4.0]])
    assert b.input_ids.tolist() == [[5, 6, 8, 9, 10], [7, 11, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert b.targets.tolist() == [[6, 8, 9, 10], [11, 0, 0, 0]]
    # target j predicts token j+1: completions start at target index len(prompt) - 1
    assert b.mask.tolist() == [[0, 1, 1, 1], [1, 0, 0, 0]]
    assert b.behaviour_logp.tolist() == [[0, -1, -2, -3], [-4, 0, 0, 0]]
    sub = b.select(torch.tensor([1]))
    assert sub.input_ids.tolist() == [[7, 11]] and sub.mask.tolist() == [[1]]


def test_collate_keeps_versions_and_names_bad_rows():
    b = collate([[5, 6], [7]], [[8, 9], [11]], pad_id=0, versions=[[3, 4], [5]])
    assert b.versions.tolist() == [[-1, 3, 4], [5, -1, -1]]
    with pytest.raises(ValueError, match="completion 1 is empty"):
        collate([[5], [6]], [[7], []], pad_id=0)
    with pytest.raises(ValueError, match="versions 0 has 1 entries for 2 tokens"):
        collate([[5]], [[7, 8]], pad_id=0, versions=[[1]])
    with pytest.raises(ValueError, match="behaviour_logp 0 has 3 entries for 2 tokens"):
        collate([[5]], [[7, 8]], pad_id=0, behaviour_logp=[[0.0, 0.0, 0.0]])


def test_collate_train_mask_keeps_only_trained_completion_tokens():
    batch = collate([[5, 6], [7]], [[1, 2, 3], [4, 4]], 0, train_mask=[[True, False, True], None])
    # row 0: completion targets at 1..3, the middle one is a tool token; row 1 trains both
    assert batch.mask.tolist() == [[0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="train_mask 0 has 2 entries for 3 tokens"):
        collate([[5, 6]], [[1, 2, 3]], 0, train_mask=[[True, False]])
