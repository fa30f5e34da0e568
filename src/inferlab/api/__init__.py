"""The service layer: one function per question a user asks, each returning a frozen, typed report.

``fit`` (placement, memory, speed, bottleneck), ``plan`` (the file llama-quantize would write),
``simulate`` (the engines' KV managers on a workload), ``trace``, ``roofline``, ``capacity``,
``advise``, ``diagnose``, ``machine`` (this computer, detected), ``calibrate`` and ``validate`` (this
computer, measured and checked against llama.cpp). The
CLI and the web app parse their inputs, call these, and render the reports; ``Report.to_dict()``
is their JSON. ``configure`` resolves one configuration for every question built on a placement.
"""

from .fit import FitReport, fit
from .machine import MachineReport, machine
from .plan import PlanReport, plan
from .report import SCHEMA_VERSION, Figure, Report
from .setup import Setup, configure
from .simulate import SimReport, simulate
from .trace import TraceReport, trace
from .roofline import RooflineReport, roofline
from .capacity import CapacityReport, capacity
from .advise import AdviceReport, advise
from .diagnose import DiagnosisReport, diagnose
from .measure import CalibrationReport, ValidationReport, accept_rejected, calibrate, validate

__all__ = ["SCHEMA_VERSION", "Figure", "FitReport", "MachineReport", "PlanReport", "Report", "Setup", "SimReport",
           "configure", "fit", "machine", "plan", "simulate",
           "TraceReport", "trace", "RooflineReport", "roofline",
           "CapacityReport", "capacity", "AdviceReport", "advise", "DiagnosisReport", "diagnose",
           "CalibrationReport", "accept_rejected", "calibrate", "ValidationReport", "validate"]
