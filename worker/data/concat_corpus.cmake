# cmake -DOUTPUT=<file> -DINPUTS=<a;b;...> -P concat_corpus.cmake
# Concatenates the demo corpus files (UTF-8 text) into the one blob that corpus.cc embeds.
file(WRITE ${OUTPUT}.tmp "")
foreach(input IN LISTS INPUTS)
  file(READ ${input} content)
  file(APPEND ${OUTPUT}.tmp "${content}")
endforeach()
file(RENAME ${OUTPUT}.tmp ${OUTPUT})
