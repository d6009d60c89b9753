"""The LingBot graph of one model worker: the stages and their actors on threads (`stages`, `actors`) or in worker
process groups (`group_stages`, run by the spawned ranks), and the placement planner that decides which."""
