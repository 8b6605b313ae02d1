"""Operations on stored rows shared by the backend, the worker and operators: results, control
(retry, cancel, delete), flow (pause, resume, run now), pruning, workflows, subjects."""
