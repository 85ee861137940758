"""The read's block count (jobs/pipeline/chain.read_blocks): one block per generate
batch for a session's rows, bounded by Ray Data's own default and the file count."""

from jobs.pipeline.chain import MAX_READ_BLOCKS, read_blocks


def test_a_small_session_gets_one_block_per_generate_batch():
    assert read_blocks(240, files=1, batch_size=8) == 30
    assert read_blocks(241, files=1, batch_size=8) == 31  # the last batch partly full
    assert read_blocks(5, files=1, batch_size=16) == 1


def test_a_large_session_keeps_ray_datas_default():
    assert read_blocks(900_000, files=1, batch_size=64) == MAX_READ_BLOCKS


def test_never_fewer_blocks_than_files_and_unknown_counts_keep_the_default():
    assert read_blocks(10, files=4, batch_size=64) == 4
    assert read_blocks(0, files=2, batch_size=64) == 2  # an empty session still reads
    assert read_blocks(None, files=3, batch_size=64) is None
