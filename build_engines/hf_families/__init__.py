"""HF transformers checkpoints of the supported families -> TensorRT-LLM 1.2.x checkpoint config and tensors.

fields.py classifies every HF config field of each family (read / inert / allowed values only) and refuses the
rest; rope.py maps HF's rotary parameters; configs.py builds the TRT-LLM config per family; weights.py renames
(and fuses, splits, offsets) the tensors. build_engines/convert.py drives them.
"""
