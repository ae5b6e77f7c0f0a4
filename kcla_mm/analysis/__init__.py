"""Analysis behind tools/analysis/: cost (:mod:`.complexity`,
:mod:`.flops`, :mod:`.depth_scaling`), speed (:mod:`.timing`,
:mod:`.benchmark`), what the layers attend to
(:mod:`.layer_contributions`, :mod:`.key_similarity`) and the models they
run on (:mod:`.model_loading`). No argument parsing and no plotting here:
the tools do those."""
