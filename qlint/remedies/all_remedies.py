"""Every remedy, by the name the config and `--unsafe-fixes` use: the one table that the search
(`qlint.remedies.search`) and the patch writer (`qlint.remedies.patch`) read.

A new remedy is a module of its own here, named for its `RemedyName`, and a row below. Remedies
built together are applied in the order of the rows: `int8-layernorm` reads a normalization as it
was written, before `expand-broadcasts` puts an `expand` into it.
"""

from __future__ import annotations

from qlint.remedies.channels_last import ChannelsLast
from qlint.remedies.conv1d_as_conv2d import Conv1dAsConv2d
from qlint.remedies.derived_scale_qparams import DerivedScaleQParams
from qlint.remedies.expand_broadcasts import ExpandBroadcasts
from qlint.remedies.int8_io import Int8IO
from qlint.remedies.int8_layernorm import Int8LayerNorm
from qlint.remedies.layernorm_placement import LayerNormPlacement
from qlint.remedies.remedy import Remedy
from qlint.remedies.unfused_attention import UnfusedAttention
from qlint.settings.config import RemedyName

REMEDIES: dict[RemedyName, Remedy] = {
    r.name: r for r in (
        ChannelsLast(), UnfusedAttention(), DerivedScaleQParams(), Int8IO(), Int8LayerNorm(), ExpandBroadcasts(),
        Conv1dAsConv2d(), LayerNormPlacement())
}
