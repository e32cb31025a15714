"""
dra's cluster simulator (torch-free): profiles, workloads, replays, the study, the policy registry.
"""
from __future__ import annotations
import collections.abc
import typing
__all__: list[str] = ['ClusterInputs', 'SimApplication', 'SimJobResult', 'SimJobSpec', 'SimProfiles', 'SimResult', 'SimStudyRun', 'SimTimelinePoint', 'policy_registry', 'policy_sections', 'sim_add_cluster_policy', 'sim_default_job_price_floor', 'sim_in_place_resize_cost_stand_in_s', 'sim_policy_names', 'sim_read_workload', 'sim_remove_cluster_policy', 'sim_run', 'sim_study', 'sim_study_baselines', 'version']
class SimJobSpec:
    """
    A job of a workload: arrival, application, request.
    """
    def to_dict(self) -> dict:
        """
        Every property as a plain dict (nested results as dicts), e.g. for json.dumps.
        """
    @property
    def application(self) -> str:
        ...
    @property
    def batch(self) -> float:
        ...
    @property
    def declared_epochs(self) -> float | None:
        """
        Epochs the job declares (None: nothing).
        """
    @property
    def declared_from_file(self) -> bool:
        ...
    @property
    def gns_estimate_sigma(self) -> float:
        ...
    @property
    def gns_scale(self) -> float:
        ...
    @property
    def name(self) -> str:
        ...
    @property
    def replicas(self) -> int:
        ...
    @property
    def stop_min_delta(self) -> float:
        ...
    @property
    def stop_patience(self) -> int:
        """
        Truth: early-stopping patience (0: none).
        """
    @property
    def submit_s(self) -> float:
        ...
    @property
    def target_by_work(self) -> bool:
        ...
    @property
    def target_metric(self) -> float | None:
        ...
    @property
    def throughput_scale(self) -> float:
        ...
class SimJobResult:
    """
    One job's outcome under one policy.
    """
    def to_dict(self) -> dict:
        """
        Every property as a plain dict (nested results as dicts), e.g. for json.dumps.
        """
    @property
    def application(self) -> str:
        ...
    @property
    def busy_gpu_seconds(self) -> float:
        ...
    @property
    def completion_s(self) -> float | None:
        ...
    @property
    def compute_gpu_seconds(self) -> float:
        ...
    @property
    def declared_epochs(self) -> float | None:
        ...
    @property
    def epochs(self) -> int:
        ...
    @property
    def estimate_checks(self) -> list[typing.Annotated[list[float], "FixedSize(5)"]]:
        """
        Remaining-work estimates at 10/50/90 % of its life: (life fraction, epochs done, true remaining epochs, estimated median, tail).
        """
    @property
    def final_batch(self) -> float:
        ...
    @property
    def final_metric(self) -> float | None:
        ...
    @property
    def gpu_seconds(self) -> float:
        ...
    @property
    def jct_s(self) -> float | None:
        ...
    @property
    def max_devices(self) -> int:
        ...
    @property
    def mean_devices(self) -> float:
        """
        Mean devices while allocated.
        """
    @property
    def name(self) -> str:
        ...
    @property
    def progress(self) -> float:
        ...
    @property
    def reached_target(self) -> bool:
        ...
    @property
    def reallocations(self) -> int:
        ...
    @property
    def requested_batch(self) -> float:
        ...
    @property
    def requested_replicas(self) -> int:
        ...
    @property
    def start_s(self) -> float | None:
        ...
    @property
    def stopped_early(self) -> bool:
        ...
    @property
    def submit_s(self) -> float:
        ...
class SimTimelinePoint:
    """
    The cluster at one tick.
    """
    def to_dict(self) -> dict:
        """
        Every property as a plain dict (nested results as dicts), e.g. for json.dumps.
        """
    @property
    def allocated(self) -> int:
        ...
    @property
    def busy_fraction(self) -> float:
        ...
    @property
    def compute_fraction(self) -> float:
        ...
    @property
    def running(self) -> int:
        ...
    @property
    def time_s(self) -> float:
        ...
    @property
    def waiting(self) -> int:
        ...
class SimResult:
    """
    A simulation's jobs, timeline and totals.
    """
    def to_dict(self) -> dict:
        """
        Every property as a plain dict (nested results as dicts), e.g. for json.dumps.
        """
    @property
    def all_completed(self) -> bool:
        ...
    @property
    def capacity(self) -> int:
        ...
    @property
    def end_s(self) -> float:
        ...
    @property
    def first_submit_s(self) -> float:
        ...
    @property
    def jobs(self) -> list[SimJobResult]:
        ...
    @property
    def makespan_s(self) -> float:
        ...
    @property
    def policy(self) -> str:
        ...
    @property
    def reallocation_cost_s(self) -> float:
        ...
    @property
    def timeline(self) -> dict:
        """
        The timeline as columns.
        """
    @property
    def wall_s(self) -> float:
        ...
class SimStudyRun:
    """
    One generated job under every policy and baseline.
    """
    def to_dict(self) -> dict:
        """
        Every property as a plain dict (nested results as dicts), e.g. for json.dumps.
        """
    @property
    def best_size_devices(self) -> int:
        ...
    @property
    def cluster(self) -> int:
        ...
    @property
    def hindsight_batch(self) -> float:
        ...
    @property
    def hindsight_devices(self) -> int:
        ...
    @property
    def index(self) -> int:
        ...
    @property
    def results(self) -> dict[str, SimJobResult]:
        ...
    @property
    def spec(self) -> SimJobSpec:
        ...
class SimApplication:
    """
    An application's limits (SimProfiles.info).
    """
    def to_dict(self) -> dict:
        """
        Every property as a plain dict (nested results as dicts), e.g. for json.dumps.
        """
    @property
    def gns_noise(self) -> float:
        ...
    @property
    def init_batch(self) -> float:
        ...
    @property
    def max_batch(self) -> float:
        ...
    @property
    def max_epochs(self) -> int:
        ...
    @property
    def max_local_batch(self) -> float:
        ...
    @property
    def max_replicas(self) -> int:
        ...
    @property
    def metric_increases(self) -> bool:
        ...
    @property
    def min_local_batch(self) -> float:
        ...
    @property
    def placement_noise(self) -> float:
        ...
class SimProfiles:
    """
    Measured application profiles (a traces/ directory) for the simulator.
    """
    def __init__(self, traces_dir: str) -> None:
        ...
    def best_metric(self, application: str, batch: typing.SupportsFloat | typing.SupportsIndex, epochs: typing.SupportsInt | typing.SupportsIndex) -> float:
        """
        Best validation metric over the first `epochs` epochs at total batch `batch`.
        """
    def grad_stats(self, application: str, batch: typing.SupportsFloat | typing.SupportsIndex, epoch: typing.SupportsInt | typing.SupportsIndex) -> tuple[float, float]:
        ...
    def info(self, application: str) -> dict:
        ...
    def names(self) -> list[str]:
        ...
    def progress_at(self, application: str, epoch: typing.SupportsInt | typing.SupportsIndex) -> float:
        ...
    def throughput(self, application: str, placement: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], local_bsz: typing.SupportsFloat | typing.SupportsIndex) -> tuple[float, float]:
        """
        (step_time, sync_time) interpolated at a placement (devices per node) and local batch.
        """
class ClusterInputs:
    """
    What a cluster policy is told at one decision; valid only during the call (raises after).
    """
    def goodput(self, i: typing.SupportsInt | typing.SupportsIndex, k: typing.SupportsInt | typing.SupportsIndex) -> float:
        """
        Predicted best goodput of jobs[i] at k devices, from its online-fitted model (0 before it measured).
        """
    @property
    def capacity(self) -> int:
        """
        Devices in the cluster.
        """
    @property
    def devices_per_node(self) -> int:
        ...
    @property
    def jobs(self) -> list:
        """
        The jobs that arrived and are not done, in arrival order, as dicts of what a real scheduler knows.
        """
    @property
    def nodes(self) -> int:
        ...
    @property
    def now(self) -> float:
        """
        Simulated seconds.
        """
def policy_registry() -> list:
    """
    Every policy by name: its settings section (None: none), whether the live engine runs it, how the simulator schedules it (None: not simulated), how its system changes devices (in_place or restart) and a one-line summary, in the order reports list them.
    """
def policy_sections() -> list[str]:
    """
    Names of the policy settings sections (options of dra.Controller, members of EngineConfig).
    """
def sim_add_cluster_policy(name: str, decide: collections.abc.Callable, summary: str = '', in_place: bool = False) -> None:
    """
    Registers a Python function decide(inputs) -> [device count per job] as a simulator cluster policy.
    """
def sim_read_workload(path: str, profiles: SimProfiles = None) -> list:
    """
    Reads a workload CSV (name,time,application,num_replicas,batch_size) into job dicts; errors name file, line, column.
    """
def sim_remove_cluster_policy(name: str) -> None:
    """
    Removes a policy added with sim_add_cluster_policy (built-in ones stay).
    """
def sim_run(profiles: SimProfiles, jobs: list, policy: str, reallocation_cost_s: typing.SupportsFloat | typing.SupportsIndex = 30.0, interval_s: typing.SupportsFloat | typing.SupportsIndex = 60.0, nodes: typing.SupportsInt | typing.SupportsIndex = 16, devices_per_node: typing.SupportsInt | typing.SupportsIndex = 4, quota_scale: typing.SupportsFloat | typing.SupportsIndex = 0.0, record_timeline: bool = True, declared_sigma: typing.SupportsFloat | typing.SupportsIndex = 0.0, declared_none_share: typing.SupportsFloat | typing.SupportsIndex = 0.0, early_stop_share: typing.SupportsFloat | typing.SupportsIndex = 0.0, declaration_seed: typing.SupportsInt | typing.SupportsIndex = 1, progress: collections.abc.Callable[[float, int, int], bool] = None, launch_cost_s: typing.SupportsFloat | typing.SupportsIndex = -1.0) -> dict:
    """
    Simulates jobs (dicts as from sim_read_workload) on a cluster under one policy; returns a result dict. Each job's first start costs launch_cost_s (< 0: reallocation_cost_s, as every later change). Jobs declare their epoch budget with log-normal error declared_sigma (a file's declared_epochs column is kept), a share declares nothing, a share stops early on a plateau (declare_budgets).
    """
def sim_study(profiles: SimProfiles, pool: list, runs: typing.SupportsInt | typing.SupportsIndex, seed: typing.SupportsInt | typing.SupportsIndex, policies: collections.abc.Sequence[str], reallocation_cost_s: typing.SupportsFloat | typing.SupportsIndex = 1.0, quota_scale: typing.SupportsFloat | typing.SupportsIndex = 1.0, interval_s: typing.SupportsFloat | typing.SupportsIndex = 60.0, noise: bool = True, reference_limits: bool = False, perturb: bool = False, shared_cluster: bool = False, jobs_per_cluster: typing.SupportsInt | typing.SupportsIndex = 160, hindsight: bool = True, price_floor: typing.SupportsFloat | typing.SupportsIndex = 0.1, declared_sigma: typing.SupportsFloat | typing.SupportsIndex = 0.0, declared_none_share: typing.SupportsFloat | typing.SupportsIndex = 0.0, gns_estimate_sigma: typing.SupportsFloat | typing.SupportsIndex = 0.2, target_by_work: bool = True, compare_target_rules: bool = True, progress: collections.abc.Callable[[int, int], None] = None) -> list:
    """
    Generates `runs` jobs from the request pool (seeded) and simulates each under the static baselines and every dynamic policy, alone or (shared_cluster) in groups contending for one cluster.
    """
sim_default_job_price_floor: float = 0.1
sim_in_place_resize_cost_stand_in_s: float = 1.0
sim_policy_names: list = ['static', 'tiresias', 'convergence', 'goodput', 'convergence_aware', 'arbiter', 'pollux', 'oracle_convergence_aware']
sim_study_baselines: list = ['static_request', 'static_best_size', 'static_best_hindsight']
version: str = '0.2.0'
