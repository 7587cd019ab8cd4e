"sage.attention"() ({
  %a = "sage.dequant"(%b) : (!sage.tile) -> !sage.tile
}) {sym_name = "t"} : () -> ()
