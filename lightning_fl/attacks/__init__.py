"""Gradient-leakage and model-inversion attacks; each runs standalone: ``attack.reconstruct(view)``."""

from lightning_fl.attacks.adaptive import KnownMaskAttack, NoiseAwareAttack, PrivateUnknownsAttack
from lightning_fl.attacks.analytic import AnalyticLinearAttack
from lightning_fl.attacks.base import GradientAttack, IterationCallback, Reconstruction
from lightning_fl.attacks.dlg import DLGAttack
from lightning_fl.attacks.gradient_matching import GradientMatchingAttack, leaked_batch_size
from lightning_fl.attacks.grnn import GRNN, GRNNGenerator
from lightning_fl.attacks.idlg import IDLGAttack
from lightning_fl.attacks.imprint import ImprintBlock, MaliciousImprint
from lightning_fl.attacks.inverting_gradients import InvertingGradientsAttack
from lightning_fl.attacks.label_impact import LabelImpact, label_impact
from lightning_fl.attacks.labels import infer_labels, sign_search_candidates
from lightning_fl.attacks.metrics import score_reconstruction
from lightning_fl.attacks.model_inversion import ColludingClientInversion, MIFace
from lightning_fl.attacks.prior_baseline import PriorBaseline
from lightning_fl.attacks.report import attack_report
from lightning_fl.attacks.robbing_the_fed import RobbingTheFedAttack
from lightning_fl.attacks.see_through_gradients import SeeThroughGradientsAttack

__all__ = [
    "GRNN",
    "AnalyticLinearAttack",
    "ColludingClientInversion",
    "DLGAttack",
    "GRNNGenerator",
    "GradientAttack",
    "GradientMatchingAttack",
    "IDLGAttack",
    "ImprintBlock",
    "InvertingGradientsAttack",
    "IterationCallback",
    "KnownMaskAttack",
    "LabelImpact",
    "MIFace",
    "MaliciousImprint",
    "NoiseAwareAttack",
    "PriorBaseline",
    "PrivateUnknownsAttack",
    "Reconstruction",
    "RobbingTheFedAttack",
    "SeeThroughGradientsAttack",
    "attack_report",
    "infer_labels",
    "label_impact",
    "leaked_batch_size",
    "score_reconstruction",
    "sign_search_candidates",
]
