"""One Spark application that keeps many MVs fresh (the shared forward of a job folder)."""
