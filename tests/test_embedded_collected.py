"""The embedded build reads its collected episodes in a fixed order: concurrent collectors write
them as they finish, and the training data's order (so the trained weights) must not follow."""

from test_experience_training_data import episode

from dreamgym_agents.pipeline.embedded import read_collected
from dreamgym_agents.types import write_trajectories


def test_collected_episodes_come_in_the_same_order_whatever_order_they_finished(tmp_path):
    eps = [episode(str(i), "$1.00", i % 2 == 0) for i in range(4)]
    for i, e in enumerate(eps):
        e.episode_id = f"oracle-webarena-train-{i}"
    other = episode("x", "$2.00", True)
    other.episode_id = "random-webarena-train-0"
    for folder, order in (("a", [2, 0, 3, 1]), ("b", [1, 3, 0, 2])):
        (tmp_path / folder / "oracle").mkdir(parents=True)
        (tmp_path / folder / "random").mkdir()
        write_trajectories(tmp_path / folder / "oracle" / "trajectories.jsonl",
                           [eps[i] for i in order])
        write_trajectories(tmp_path / folder / "random" / "trajectories.jsonl", [other])
    a = read_collected(tmp_path / "a", ["random", "oracle"])
    b = read_collected(tmp_path / "b", ["random", "oracle"])
    assert [t.episode_id for t in a] == [t.episode_id for t in b]
    # collector by collector, in the order asked for
    assert [t.episode_id for t in a][:2] == ["random-webarena-train-0", "oracle-webarena-train-0"]
    assert len(a) == 5
